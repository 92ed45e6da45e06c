"""Spell numbers as words, in Chinese and in English, for the text normaliser.

A small stand-in for the number rules of the upstream text frontends (wetext / inflect); see
:mod:`cosyvoice.text.prompt` for where it is used and what it deliberately does not cover.
"""

from __future__ import annotations

import re

__all__ = [
    "english_cardinal",
    "english_digits",
    "english_ordinal",
    "spell_numbers_en",
    "spell_numbers_zh",
    "zh_cardinal",
    "zh_digits",
]

_ZH_DIGITS = "零一二三四五六七八九"
_ZH_SMALL_UNITS = ("", "十", "百", "千")
_ZH_BIG_UNITS = ("", "万", "亿", "万亿")
_MAX_CARDINAL_DIGITS = 9  # longer runs (phone numbers, ids) are read digit by digit

_EN_ONES = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
    "sixteen seventeen eighteen nineteen"
).split()
_EN_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()
_EN_GROUPS = ("", " thousand", " million", " billion", " trillion")
_EN_ORDINAL_WORDS = {
    "one": "first",
    "two": "second",
    "three": "third",
    "five": "fifth",
    "eight": "eighth",
    "nine": "ninth",
    "twelve": "twelfth",
}


def zh_digits(digits: str) -> str:
    """Read a digit string one digit at a time: "2024" -> "二零二四"."""
    return "".join(_ZH_DIGITS[int(d)] for d in digits)


def _zh_group(value: int) -> str:
    """0 < value < 10000, without a leading 零."""
    out = []
    pending_zero = False
    for position in range(3, -1, -1):
        digit = value // 10**position % 10
        if digit == 0:
            pending_zero = bool(out)
            continue
        if pending_zero:
            out.append("零")
            pending_zero = False
        out.append(_ZH_DIGITS[digit] + _ZH_SMALL_UNITS[position])
    return "".join(out)


def zh_cardinal(digits: str) -> str:
    """Chinese cardinal reading: "105" -> "一百零五", "15" -> "十五", "100005" -> "十万零五"."""
    value = int(digits)
    if value == 0:
        return "零"
    groups = []
    while value:
        groups.append(value % 10000)
        value //= 10000
    out = []
    for index in range(len(groups) - 1, -1, -1):
        group = groups[index]
        if group == 0:
            continue
        if out and (group < 1000 or groups[index + 1] == 0):
            out.append("零")
        out.append(_zh_group(group) + _ZH_BIG_UNITS[index])
    text = "".join(out)
    return text[1:] if text.startswith("一十") else text


def _zh_number(digits: str) -> str:
    if len(digits) > 1 and digits.startswith("0") or len(digits) > _MAX_CARDINAL_DIGITS:
        return zh_digits(digits)
    return zh_cardinal(digits)


def _zh_decimal(whole: str, fraction: str | None) -> str:
    return _zh_number(whole) + ("点" + zh_digits(fraction) if fraction else "")


def _zh_time(hours: str, minutes: str) -> str:
    if minutes == "00":
        return _zh_number(hours) + "点"
    return (
        _zh_number(hours) + "点" + (zh_digits(minutes) if minutes[0] == "0" else zh_cardinal(minutes)) + "分"
    )


def spell_numbers_zh(text: str) -> str:
    """Arabic numerals in Chinese text -> Chinese words (times, money, percent, decimals, years, integers)."""
    number = r"(\d+)(?:\.(\d+))?"
    text = re.sub(r"(?<!\d)(\d{1,2}):(\d{2})(?!\d)", lambda m: _zh_time(m[1], m[2]), text)
    text = re.sub(r"[¥￥]" + number, lambda m: _zh_decimal(m[1], m[2]) + "元", text)
    text = re.sub(r"\$" + number, lambda m: _zh_decimal(m[1], m[2]) + "美元", text)
    # (?<!\d): tried once per digit run, not at each digit (quadratic on a long run, same matches)
    text = re.sub(r"(?<!\d)" + number + r"[%％]", lambda m: "百分之" + _zh_decimal(m[1], m[2]), text)
    text = re.sub(r"(?<!\d)(\d+)\.(\d+)", lambda m: _zh_decimal(m[1], m[2]), text)
    text = re.sub(r"(\d{2,4})(?=年)", lambda m: zh_digits(m[1]), text)
    return re.sub(r"\d+", lambda m: _zh_number(m[0]), text)


def english_digits(digits: str) -> str:
    """Read a digit string one digit at a time: "007" -> "zero zero seven"."""
    return " ".join(_EN_ONES[int(d)] for d in digits)


def _en_below_thousand(value: int, *, and_word: bool) -> str:
    hundreds, rest = divmod(value, 100)
    words = []
    if hundreds:
        words.append(f"{_EN_ONES[hundreds]} hundred")
    if rest:
        if hundreds or and_word:
            words.append("and")
        if rest < 20:
            words.append(_EN_ONES[rest])
        else:
            tens, ones = divmod(rest, 10)
            words.append(_EN_TENS[tens] + (f"-{_EN_ONES[ones]}" if ones else ""))
    return " ".join(words)


def english_cardinal(value: int) -> str:
    """British-style cardinal: 2024 -> "two thousand and twenty-four", 1234567 -> "one million, ..."."""
    if value < 0:
        return "minus " + english_cardinal(-value)
    if value == 0:
        return "zero"
    groups = []
    while value:
        groups.append(value % 1000)
        value //= 1000
    if len(groups) > len(_EN_GROUPS):
        raise ValueError("number too large to spell")
    parts = []
    for index in range(len(groups) - 1, -1, -1):
        if groups[index]:
            # "and" joins a last group below 100 to the groups before it ("one thousand and five")
            and_word = index == 0 and bool(parts) and groups[0] < 100
            parts.append(_en_below_thousand(groups[index], and_word=and_word) + _EN_GROUPS[index])
    if len(parts) > 1 and parts[-1].startswith("and "):
        return ", ".join(parts[:-1]) + " " + parts[-1]
    return ", ".join(parts)


def english_ordinal(value: int) -> str:
    """12 -> "twelfth", 21 -> "twenty-first", 100 -> "one hundredth"."""
    head, last = re.fullmatch(r"(.*?[ -]?)([a-z]+)", english_cardinal(value)).groups()
    if last in _EN_ORDINAL_WORDS:
        last = _EN_ORDINAL_WORDS[last]
    elif last.endswith("y"):
        last = last[:-1] + "ieth"
    else:
        last += "th"
    return head + last


def _en_number(digits: str) -> str:
    if len(digits) > 1 and digits.startswith("0") or len(digits) > _MAX_CARDINAL_DIGITS:
        return english_digits(digits)
    return english_cardinal(int(digits))


def _en_time(hours: str, minutes: str) -> str:
    if minutes == "00":
        return _en_number(hours) + " o'clock"
    return _en_number(hours) + (
        " oh " + _EN_ONES[int(minutes[1])] if minutes[0] == "0" else " " + _en_number(minutes)
    )


def spell_numbers_en(text: str) -> str:
    """Arabic numerals in English text -> words (times, dollars, percent, decimals, ordinals, integers)."""
    number = r"(\d+)(?:\.(\d+))?"
    text = re.sub(r"(?<!\d)(\d{1,2}):(\d{2})(?!\d)", lambda m: _en_time(m[1], m[2]), text)
    text = re.sub(r"\$" + number, lambda m: _en_decimal(m[1], m[2]) + " dollars", text)
    text = re.sub(r"(?<!\d)" + number + "%", lambda m: _en_decimal(m[1], m[2]) + " percent", text)
    text = re.sub(r"(?<!\d)(\d+)\.(\d+)", lambda m: _en_decimal(m[1], m[2]), text)
    text = re.sub(
        r"(?<!\d)(\d{1,9})(?:st|nd|rd|th)\b", lambda m: english_ordinal(int(m[1])), text, flags=re.IGNORECASE
    )
    return re.sub(r"\d+", lambda m: _en_number(m[0]), text)


def _en_decimal(whole: str, fraction: str | None) -> str:
    return _en_number(whole) + (" point " + english_digits(fraction) if fraction else "")

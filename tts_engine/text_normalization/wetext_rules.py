"""Our rules around WeTextProcessing (``wetext``), only where its grammars have none or read wrongly.

Each rule below was added for a reading that wetext 0.1.8 gets wrong or leaves alone (measured, see
``tests/test_text_normalization_cases.py``); everything else is the library's. Rules run on one
sentence, before (``before_zh``/``before_en``) or after (``after_zh``/``after_en``) the library.

Chinese, before wetext:

* URLs and e-mail addresses: wetext leaves them as written; we read them the way people do
  (``www点example点com``, ``test艾特example点com``; the scheme ``https://`` is not read).
* Phone numbers with a country code or dashes (``+86 138 1234 5678``, ``400-800-1234``,
  ``010-12345678``): wetext reads ``+86`` as ``正八十六`` and dashed groups as cardinals or with
  ``一``; we read digit by digit with ``幺`` for 1 and ``加`` for ``+``.
* Versions (``v2.4.2``, ``1.2.3``): wetext gives ``二.四点二``; we read ``二点四点二``.
* Thousands separators (``¥1,234.56``): wetext splits the amount at the comma; we drop them.
* A hyphen between a letter and a digit (``COVID-19``, ``GPT-4``): wetext reads a minus sign.
* Percent ranges (``20%-30%``): wetext reads the second as negative; we read ``到``.
* ``3x3``: wetext keeps the ``x``; we read ``乘``.
* A fraction right after a Chinese character (``约1/3``): wetext's reordering moves that character
  into the fraction (``三分之约一``); we keep them apart.
* ``2点`` (a time): wetext says ``二点``; we say ``两点``.

Chinese, after wetext: ``第两`` -> ``第二`` (wetext reads ``第2名`` as ``第两名``), and blanks
between Chinese characters are dropped (the CosyVoice frontend drops them as well).

English, before wetext:

* Versions (``v2.4.2``): wetext gives ``v two.four point two``.
* Dollar amounts and decimals of 1,000 or more: wetext drops the leading "one"
  (``$1,234.56`` -> "thousand two hundred ..."); we spell them (``one thousand two hundred and thirty
  four dollars and fifty six cents``).
* Percent ranges (``50%-60%``: wetext says "fifty-sixty percent"; "fifty to sixty percent").

English, after wetext: a doubled "the the" (``the 2026-11-24 deadline``) is said once.
"""

from __future__ import annotations

import re

from cosyvoice.text.numbers import english_cardinal, english_digits, zh_cardinal, zh_digits

__all__ = ["after_en", "after_zh", "before_en", "before_zh"]

_URL_STOP = r"\s，。！？；、（）()<>\"'“”‘’【】"
_URL = re.compile(rf"(?:https?://|www\.)[^{_URL_STOP}]+|[\w.+-]+@[\w-]+(?:\.[\w-]+)+", re.ASCII)
_URL_TRAILING = ".,;:!?"
_URL_WORDS = {".": "点", "@": "艾特", "/": "斜杠", "-": "杠", "_": "下划线", ":": "冒号", "?": "问号",
              "=": "等于", "&": "和", "#": "井号", "%": "百分号"}  # fmt: skip
_PHONE_CC = re.compile(r"\+(\d{1,3})[\s-]?(\d{2,4}(?:[\s-]\d{2,5}){1,3})(?![\d-])", re.ASCII)
_PHONE_DASHED = re.compile(r"(?<![\w.-])(?:\d{3,4}-\d{3,4}-\d{4}|0\d{2,3}-\d{7,8})(?![\w-])", re.ASCII)
_VERSION = re.compile(r"(?<![\w.])(?:([vV])(\d+(?:\.\d+)+)|(\d+\.\d+\.\d+))(?![\w.]|\.\d)", re.ASCII)
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))", re.ASCII)
_LETTER_HYPHEN_DIGIT = re.compile(r"(?<=[A-Za-z])-(?=\d)", re.ASCII)
_PERCENT_RANGE = re.compile(r"%\s*[-–—~～]\s*(?=[\d.]+%)", re.ASCII)
_TIMES = re.compile(r"(?<![\w.])(\d+)\s*[x×]\s*(\d+)(?![\w.])", re.ASCII)
_FRACTION_AFTER_HAN = re.compile(r"(?<=[\u4e00-\u9fff])(?=\d+/\d+)", re.ASCII)
_TWO_OCLOCK = re.compile(r"(?<![\d.])2(?=点(?![\d零一二三四五六七八九十]))", re.ASCII)
_BLANK_BETWEEN_HAN = re.compile(r"(?<=[\u4e00-\u9fff])\s+(?=[\u4e00-\u9fff])")
_EN_MONEY = re.compile(
    r"\$\s?(\d{1,3}(?:,\d{3})+|\d+)(?:\.(\d+))?(?!\d|,\d|\s*(?:thousand|million|billion|trillion)\b)",
    re.IGNORECASE | re.ASCII,
)
_EN_BIG_DECIMAL = re.compile(r"(?<![\d.,])(\d{1,3}(?:,\d{3})+|\d{4,})\.(\d+)(?![\d.])", re.ASCII)
_EN_DOUBLE_THE = re.compile(r"\b([Tt]he) the\b")


def _phone_digits_zh(digits: str) -> str:
    return "".join("幺" if d == "1" else zh_digits(d) for d in digits if d.isdigit())


_MAX_CARDINAL_DIGITS = 12  # longer digit runs are read one digit at a time


def _part_zh(part: str) -> str:
    if len(part) > 1 and part.startswith("0") or len(part) > _MAX_CARDINAL_DIGITS:
        return zh_digits(part)
    return zh_cardinal(part)


def _part_en(part: str) -> str:
    if len(part) > 1 and part.startswith("0"):
        return english_digits(part)
    return _cardinal_en(int(part))


def _cardinal_en(value: int) -> str:
    """wetext's style: "one thousand two hundred and thirty four" (no commas, no hyphens)."""
    if value >= 10**_MAX_CARDINAL_DIGITS:
        return english_digits(str(value))
    return english_cardinal(value).replace(",", "").replace("-", " ")


def _url_zh(match: re.Match[str]) -> str:
    url = match.group(0)
    core = url.rstrip(_URL_TRAILING)
    spoken = re.sub(r"^https?://", "", core).rstrip("/")
    return "".join(_URL_WORDS.get(char, char) for char in spoken) + url[len(core) :]


def _phone_cc_zh(match: re.Match[str]) -> str:
    groups = re.split(r"[\s-]", match.group(2))
    return "加" + _phone_digits_zh(match.group(1)) + " " + " ".join(_phone_digits_zh(g) for g in groups)


def _version(match: re.Match[str], *, zh: bool) -> str:
    prefix, parts = (match.group(1), match.group(2)) if match.group(1) else ("", match.group(3))
    if zh:
        return prefix + "点".join(_part_zh(p) for p in parts.split("."))
    return (prefix + " " if prefix else "") + " point ".join(_part_en(p) for p in parts.split("."))


def before_zh(text: str) -> str:
    text = _URL.sub(_url_zh, text)
    text = _PHONE_CC.sub(_phone_cc_zh, text)
    text = _PHONE_DASHED.sub(lambda m: _phone_digits_zh(m.group(0)), text)
    text = _VERSION.sub(lambda m: _version(m, zh=True), text)
    text = _THOUSANDS.sub("", text)
    text = _LETTER_HYPHEN_DIGIT.sub("", text)
    text = _PERCENT_RANGE.sub("%~", text)
    text = _TIMES.sub(r"\1乘\2", text)
    text = _FRACTION_AFTER_HAN.sub(" ", text)
    return _TWO_OCLOCK.sub("两", text)


def after_zh(text: str) -> str:
    return _BLANK_BETWEEN_HAN.sub("", text.replace("第两", "第二"))


def _money_en(match: re.Match[str]) -> str:
    dollars = int(match.group(1).replace(",", ""))
    cents_digits = match.group(2)
    if cents_digits is not None and len(cents_digits) > 2:  # "$1.234": not cents, read the decimal
        return f"{_cardinal_en(dollars)} point {english_digits(cents_digits)} dollars"
    cents = int(cents_digits.ljust(2, "0")) if cents_digits else 0
    words = f"{_cardinal_en(dollars)} dollar{'' if dollars == 1 else 's'}"
    if cents:
        cent_words = f"{_cardinal_en(cents)} cent{'' if cents == 1 else 's'}"
        words = cent_words if dollars == 0 else f"{words} and {cent_words}"
    return words


def before_en(text: str) -> str:
    text = _VERSION.sub(lambda m: _version(m, zh=False), text)
    text = _EN_MONEY.sub(_money_en, text)
    text = _EN_BIG_DECIMAL.sub(
        lambda m: f"{_cardinal_en(int(m.group(1).replace(',', '')))} point {english_digits(m.group(2))}", text
    )
    return _PERCENT_RANGE.sub("% to ", text)


def after_en(text: str) -> str:
    return _EN_DOUBLE_THE.sub(r"\1", text)

"""Turn LLM output into text a TTS engine should read aloud.

``clean_for_speech()`` removes emoji and Markdown syntax and normalises whitespace; the punctuation
stays, because the TTS needs it for prosody. It works on any fragment: the segmenter cleans one
sentence at a time, so a bold span or a list can be cut in the middle. That is why the Markdown
rules are local patterns (a ``**`` run next to a space or the end of the text is a delimiter, a
``*`` between two digits is multiplication) rather than a full CommonMark parse, which would keep
unpaired delimiters as literal text.

Emoji are found by Unicode properties (``Extended_Pictographic``) through the ``regex`` package, so
new emoji are covered when its Unicode tables are updated.

``lone_surrogate_at()`` and ``has_speech()`` are the checks an API applies to text before speaking it:
a lone UTF-16 surrogate (``"\\ud800"`` in JSON) cannot be encoded, and text whose only content is
punctuation, symbols or emoji has nothing to say. ``clean_for_speech()`` drops lone surrogates.
"""

from __future__ import annotations

from collections.abc import Callable

import regex

__all__ = ["clean_for_speech", "first_emoji", "has_speech", "lone_surrogate_at"]

# --- emoji ---------------------------------------------------------------------------------------

# Pictographic characters that are ordinary text unless an emoji-presentation selector follows.
_TEXT_SYMBOLS = "©®™‼⁉〰〽"
_MODIFIERS = r"\uFE0E\uFE0F\U0001F3FB-\U0001F3FF"  # variation selectors 15/16, skin tones
_TAGS = r"\U000E0020-\U000E007F"  # subdivision-flag tag characters
_ATOM = (
    rf"(?:[{_TEXT_SYMBOLS}]\uFE0F|(?![{_TEXT_SYMBOLS}])\p{{Extended_Pictographic}})"
    rf"[{_MODIFIERS}]*[{_TAGS}]*"
)
_EMOJI_SEQUENCE = regex.compile(
    r"[\U0001F1E6-\U0001F1FF]{1,2}"  # flags (regional-indicator pairs)
    r"|[0-9#*]\uFE0F?\u20E3"  # keycaps
    rf"|{_ATOM}(?:\u200D{_ATOM})*\u200D?"  # pictographs, modifiers and ZWJ sequences
)
# Left over after the sequences are gone: stray selectors, skin tones, keycap marks, tags,
# zero-width spaces and byte-order marks.
_EMOJI_LEFTOVERS = regex.compile(
    rf"[\uFE00-\uFE0F\u20E3\U0001F3FB-\U0001F3FF{_TAGS}\U000E0100-\U000E01EF\u200B\uFEFF]"
)

# --- Markdown, line by line ----------------------------------------------------------------------

_FENCE_LINE = regex.compile(r"^\s*(?:```|~~~).*$")
_RULE_LINE = regex.compile(r"^\s{0,3}([-*_])(?:\s*\1){2,}\s*$")
_TABLE_SEPARATOR = regex.compile(r"^\s*\|?\s*:?-+:?\s*(?:\|\s*:?-+:?\s*)+\|?\s*$")
_TABLE_ROW = regex.compile(r"^\s*\|(.*)\|\s*$")
_HEADING = regex.compile(r"^\s{0,3}#{1,6}(?:\s+|$)")
_HEADING_CLOSE = regex.compile(r"\s+#+\s*$")
_BLOCKQUOTE = regex.compile(r"^\s*(?:>\s?)+")
_LIST_BULLET = regex.compile(r"^\s*(?:[-*+•]|\d{1,3}[.)])\s+(?:\[[ xX]\]\s+)?")

# --- Markdown, inline ----------------------------------------------------------------------------

_CODE_SPAN = regex.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)")
_ESCAPE = regex.compile(r"\\([\\`*_{}\[\]()#+\-.!|>~])")
_IMAGE = regex.compile(r"!\[[^\]]*\]\([^)]*\)")
_LINK = regex.compile(r"\[([^\]]+)\]\([^)]*\)|\[([^\]]+)\]\[[^\]]*\]")
_AUTOLINK = regex.compile(r"<((?:https?://|mailto:)[^>\s]+|[^>\s@]+@[^>\s]+)>")
_LINE_BREAK_TAG = regex.compile(r"<br\s*/?>", regex.IGNORECASE)
_BARE_URL = regex.compile(
    r"(?:https?://|www\.)[^\s<>()\[\]{}\"'“”‘’（）。，、！？；：]+"
    r"|[\w.+-]+@[\w-]+(?:\.[\w-]+)+"
)
_URL_TRAILING = ".,;:!?*~"
_DELIMITER_RUN = regex.compile(r"\*+|_+|~{2,}")
# Placeholders protect code spans, escapes and URLs from the emphasis rules (private-use area).
_PLACEHOLDER = regex.compile(r"\uE000(\d+)\uE001")
# Removed from the input first: lone surrogates (not encodable) and the placeholder delimiters
# (text that spelled a placeholder would be replaced by another part of the text, or loop).
_NOT_TEXT = regex.compile(r"[\uD800-\uDFFF\uE000\uE001]")
_LETTER_OR_DIGIT = regex.compile(r"[\p{L}\p{N}]")

# --- whitespace ----------------------------------------------------------------------------------

_WHITESPACE = regex.compile(r"\s+")
_URL_BEFORE = regex.compile(r"(?:https?://|www\.)\S*$", regex.IGNORECASE)
_CJK = regex.compile(r"[\p{Han}\p{Hiragana}\p{Katakana}\u3000-\u303F\uFF00-\uFFEF]")


def first_emoji(text: str) -> str | None:
    """Return the first emoji in ``text`` exactly as it appears there, or None.

    A sequence counts as one emoji: ``"👍🏽"`` (skin tone), ``"❤️"`` (with its variation selector),
    ``"👨‍👩‍👧"`` (ZWJ), ``"🇨🇳"`` (flag), ``"1️⃣"`` (keycap). ``©``, ``®``, ``™`` and a few
    other symbols that are text by default are not emoji unless written with U+FE0F.
    """
    match = _EMOJI_SEQUENCE.search(text)
    return match.group(0) if match else None


def lone_surrogate_at(text: str) -> int | None:
    """Index of the first lone UTF-16 surrogate in ``text`` (which UTF-8 cannot encode), or None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return None


def has_speech(text: str) -> bool:
    """True when ``text`` has a letter or digit outside its emoji (not only punctuation, symbols, emoji)."""
    return _LETTER_OR_DIGIT.search(_EMOJI_SEQUENCE.sub("", text)) is not None


def clean_for_speech(text: str) -> str:
    """Return ``text`` without emoji and Markdown, whitespace collapsed, stripped.

    Runs of whitespace (newlines included) become one space, or nothing where both neighbours are
    CJK characters or CJK punctuation. Punctuation, numbers, ``3*4``, ``a_b``, ``C++`` and bare
    URLs are kept as written; lone surrogates are dropped.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be str, not {type(text).__name__}")
    text = _NOT_TEXT.sub("", text)
    text = _EMOJI_SEQUENCE.sub("", text)
    text = _EMOJI_LEFTOVERS.sub("", text)
    lines = [_clean_line(line) for line in text.splitlines()]
    return _collapse_whitespace("\n".join(line for line in lines if line))


def _clean_line(line: str) -> str:
    if _FENCE_LINE.match(line) or _RULE_LINE.match(line) or _TABLE_SEPARATOR.match(line):
        return ""
    row = _TABLE_ROW.match(line)
    if row:
        cells = [cell.strip() for cell in row.group(1).split("|")]
        cells = [cell for cell in cells if cell]
        separator = "，" if any(_CJK.search(cell) for cell in cells) else ", "
        line = separator.join(cells)
    if _HEADING.match(line):
        line = _HEADING_CLOSE.sub("", _HEADING.sub("", line, count=1))
    line = _BLOCKQUOTE.sub("", line, count=1)
    line = _LIST_BULLET.sub("", line, count=1)
    return _clean_inline(line).strip()


def _clean_inline(line: str) -> str:
    protected: list[str] = []

    def protect(value: str) -> str:
        protected.append(value)
        return f"\ue000{len(protected) - 1}\ue001"

    line = _CODE_SPAN.sub(lambda m: protect(m.group(2).strip() or m.group(2)), line)
    line = _ESCAPE.sub(lambda m: protect(m.group(1)), line)
    line = _IMAGE.sub("", line)
    line = _LINK.sub(lambda m: m.group(1) or m.group(2), line)
    line = _AUTOLINK.sub(lambda m: protect(m.group(1)), line)
    line = _LINE_BREAK_TAG.sub(" ", line)
    line = _BARE_URL.sub(_protect_url(protect), line)
    line = _DELIMITER_RUN.sub(_drop_emphasis_delimiter, line)
    # A URL may hold an autolink's or an escape's placeholder. A value only holds placeholders made
    # before it (the input has no delimiters of its own, see _NOT_TEXT), so this loop ends.
    for _ in range(len(protected)):
        if not _PLACEHOLDER.search(line):
            break
        line = _PLACEHOLDER.sub(lambda m: protected[int(m.group(1))], line)
    return line


def _protect_url(protect: Callable[[str], str]) -> Callable[[regex.Match[str]], str]:
    def replace(match: regex.Match[str]) -> str:
        url = match.group(0)
        core = url.rstrip(_URL_TRAILING)
        return protect(core) + url[len(core) :]

    return replace


def _drop_emphasis_delimiter(match: regex.Match[str]) -> str:
    run = match.group(0)
    text = match.string
    before = text[match.start() - 1] if match.start() > 0 else ""
    after = text[match.end()] if match.end() < len(text) else ""
    if before.isspace() and after.isspace():
        return run  # "3 * 4", "a _ b": not emphasis
    if run[0] == "*" and len(run) <= 2 and _is_math_left(before) and _is_math_right(after):
        return run  # 3*4, 2**10, f(x)*2
    if run[0] == "_" and _is_word(before) and _is_word(after):
        return run  # snake_case, a_b (CJK next to "_" means emphasis: 还有__下划线__)
    return ""


def _is_math_left(ch: str) -> bool:
    return ch.isascii() and (ch.isalnum() or ch == ")")


def _is_math_right(ch: str) -> bool:
    return ch.isascii() and (ch.isalnum() or ch == "(")


def _is_word(ch: str) -> bool:
    return ch.isalnum() and not _CJK.match(ch)


def _collapse_whitespace(text: str) -> str:
    def replace(match: regex.Match[str]) -> str:
        start, end = match.span()
        if start == 0 or end == len(text):
            return ""
        if _CJK.match(text[start - 1]) and _CJK.match(text[end]) and not _URL_BEFORE.search(text, 0, start):
            return ""
        return " "

    return _WHITESPACE.sub(replace, text)

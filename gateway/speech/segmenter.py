"""Cut a streamed LLM reply into sentences for the TTS, one turn at a time.

``SentenceSegmenter`` is synchronous and does no I/O: ``push(delta)`` returns the segments that are
finished, ``flush()`` the rest when the reply has ended. Every decision is taken only once the
characters it depends on have arrived (after ``.`` that is the next non-space character, so
``$29.99`` and ``e.g. this`` are never cut early). Hence the segments do not depend on how the reply
was split into deltas.

Where a segment ends:

- after a sentence ender ``。！？!?；;``, an ellipsis (``...``, ``…``, ``……``) as a whole, or a
  ``.`` that ends a sentence (not a decimal point, a known abbreviation, a dotted acronym, a list
  number such as ``1.`` at the start of a segment, or a ``.`` followed by a lowercase word);
  closing quotes and brackets right after the ender stay with the sentence;
- for the first segment of a turn, also after ``，,、：:`` once the segment has ``min_first_chars``
  letters or digits, so the first audio starts early;
- at a newline (paragraphs, list items, code blocks);
- never inside a URL (``https://...``, ``www.x.com``), between ASCII characters of one token
  (``a.b@x.com``, ``12:30``, ``1,000``) or inside a Markdown code span;
- a segment longer than ``max_chars`` is cut at the last comma-like mark or space before the limit,
  else at the last grapheme boundary before it.

Segments are passed through ``clean_for_speech`` (emoji and Markdown removed, punctuation kept);
segments with no letter or digit left are dropped.

The work is linear in the length of the reply, however it is split into deltas: the scan resumes
where the last ``push`` stopped, runs of characters are skipped by compiled patterns, and no
look-ahead reaches further than ``max_chars`` past the point it decides (a run of ``.``, backticks or
``。`` that long cannot end a segment inside the limit, so it is cut at ``max_chars`` at once; a
``.`` followed by ``max_chars`` spaces is decided as if the text ended there).
"""

from __future__ import annotations

import regex

from gateway.speech.text_cleaning import clean_for_speech

__all__ = ["SentenceSegmenter"]

_SENTENCE_ENDERS = frozenset("。！？!?；;")
_ENDER_RUN = frozenset("。！？!?；;.…")
_COMMA_MARKS = frozenset("，,、：:")
_PUNCTUATION_AFTER = _ENDER_RUN | _COMMA_MARKS
_CLOSERS = frozenset("\"'”’」』】》〉）)]}")
_NEWLINES = frozenset("\n\r")
# Comma-like marks and spaces where an over-long segment may be cut.
_SOFT_CUTS = frozenset("，,、：:；;")

# Words that end in "." without ending the sentence (compared lower-case, dot included).
_ABBREVIATIONS = frozenset(
    """mr. mrs. ms. dr. prof. sr. jr. st. mt. ft. vs. etc. e.g. i.e. a.m. p.m. u.s. u.k. u.n.
    e.u. ph.d. inc. ltd. co. corp. dept. est. approx. fig. figs. vol. no. nos. cf. al. jan. feb.
    mar. apr. jun. jul. aug. sep. sept. oct. nov. dec. mon. tue. wed. thu. fri. sat. sun.""".split()
)
# "No." is an abbreviation only in front of a number ("No. 5"); otherwise it is the answer "No."
_NUMBER_ABBREVIATIONS = frozenset({"no.", "nos."})
_WORD_BEFORE_DOT = regex.compile(r"(?<![A-Za-z.])[A-Za-z][A-Za-z.]*$")
_DOTTED_ACRONYM = regex.compile(r"(?:[A-Za-z]\.)+[A-Za-z]")
_LIST_NUMBER = regex.compile(r"\s*(?:[#>]+\s*|[-*+]\s+)*\d{1,3}")
_URL_IN_TOKEN = regex.compile(r"(?:https?://|www\.)\S*$", regex.IGNORECASE)
_LETTER_OR_DIGIT = regex.compile(r"[\p{L}\p{N}]")
_GRAPHEME = regex.compile(r"\X")


def _one_of(chars: frozenset[str], repeat: str = "") -> regex.Pattern[str]:
    return regex.compile("[" + "".join(regex.escape(ch) for ch in sorted(chars)) + "]" + repeat)


# Where the scan must stop and look: outside a code span, inside one (only its closing run matters).
_MARKS = _one_of(_NEWLINES | _ENDER_RUN | {"`"})
_MARKS_WITH_COMMAS = _one_of(_NEWLINES | _ENDER_RUN | _COMMA_MARKS | {"`"})
_CODE_MARKS = _one_of(_NEWLINES | {"`"})
# Runs, matched at a position (C speed, never a Python loop over a long run).
_BACKTICK_RUN = _one_of(frozenset("`"), "*")
_ENDER_RUN_PATTERN = _one_of(_ENDER_RUN, "*")
_CLOSER_RUN = _one_of(_CLOSERS, "*")
_SPACE_RUN = regex.compile(r"[^\S\n\r]*")  # spaces and tabs, not newlines


class SentenceSegmenter:
    """Streaming sentence splitter; see the module docstring for the rules."""

    def __init__(
        self, *, first_segment_at_comma: bool = True, max_chars: int = 120, min_first_chars: int = 4
    ):
        if max_chars < 2:
            raise ValueError(f"max_chars must be at least 2, got {max_chars}")
        if min_first_chars < 0:
            raise ValueError(f"min_first_chars must not be negative, got {min_first_chars}")
        self._first_segment_at_comma = first_segment_at_comma
        self._max_chars = max_chars
        self._min_first_chars = min_first_chars
        # Segments never depend on how the text is split, so a long delta is taken in pieces this
        # long: the pending text stays short, and cutting a segment off it stays cheap.
        self._piece_chars = 4 * max_chars
        self._buffer = ""
        self._emitted_any = False  # a non-empty segment has been returned in this turn
        # Where the scan of the current segment resumes: everything before it is decided.
        self._scan = 0
        self._code_ticks = 0  # length of the backtick run that opened the current code span
        self._letters = 0  # letters or digits counted in the current segment, up to min_first_chars
        self._letters_to = 0  # ... in its text up to here

    def push(self, delta: str) -> list[str]:
        """Add text from the stream; return the segments that are now complete."""
        if not isinstance(delta, str):
            raise TypeError(f"delta must be str, not {type(delta).__name__}")
        if len(delta) <= self._piece_chars:
            self._buffer += delta
            return self._drain(final=False)
        segments: list[str] = []
        for start in range(0, len(delta), self._piece_chars):
            self._buffer += delta[start : start + self._piece_chars]
            segments += self._drain(final=False)
        return segments

    def flush(self) -> list[str]:
        """End the turn: return every remaining segment and get ready for the next turn."""
        segments = self._drain(final=True)
        self.clear()
        return segments

    def clear(self) -> None:
        """Drop pending text (e.g. on barge-in) and start a new turn."""
        self._buffer = ""
        self._emitted_any = False
        self._start_segment()

    def _start_segment(self) -> None:
        self._scan = 0
        self._code_ticks = 0
        self._letters = 0
        self._letters_to = 0

    @property
    def pending_text(self) -> str:
        """Text received but not yet returned in a segment."""
        return self._buffer

    def _drain(self, *, final: bool) -> list[str]:
        segments: list[str] = []
        while self._buffer:
            cut = self._find_cut(self._buffer, final=final)
            if cut is None:
                break
            end, resume = cut
            raw = self._buffer[:end]
            self._buffer = self._buffer[resume:]
            self._start_segment()
            # Cleaning never adds a letter: a segment without one is dropped without cleaning it.
            segment = clean_for_speech(raw) if _LETTER_OR_DIGIT.search(raw) else ""
            if _LETTER_OR_DIGIT.search(segment):
                segments.append(segment)
                self._emitted_any = True
        return segments

    def _find_cut(self, text: str, *, final: bool) -> tuple[int, int] | None:
        """Return (end of segment, start of the rest), or None when more text is needed.

        Resumes at ``self._scan`` and leaves the place to resume there when it returns None.
        """
        n = len(text)
        limit = self._max_chars
        stop = min(n, limit)
        comma_allowed = self._first_segment_at_comma and not self._emitted_any
        commas_from = 0 if comma_allowed else stop  # where a comma may start to end the segment
        code_ticks = self._code_ticks
        i = self._scan
        while i < stop:
            if code_ticks:
                marks, end = _CODE_MARKS, stop
            elif i < commas_from:
                marks, end = _MARKS, commas_from
            else:
                marks, end = _MARKS_WITH_COMMAS, stop
            found = marks.search(text, i, end)
            if found is None:
                i = end
                continue
            i = found.start()
            ch = text[i]
            if ch in _COMMA_MARKS and i < (commas_from := self._after_first_letters(text, stop)):
                continue  # too few letters before it: cleaning never adds any
            if ch in _NEWLINES:
                return i, i + 1
            if ch == "`":
                run_end = _BACKTICK_RUN.match(text, i, limit + 1).end()
                if run_end > limit:
                    i = run_end  # the run crosses the limit: no boundary before it
                    break
                if run_end == n and not final:
                    self._wait(i, code_ticks)
                    return None
                run = run_end - i
                code_ticks = run if code_ticks == 0 else (0 if run == code_ticks else code_ticks)
                i = run_end
                continue
            decision = self._decide(text, i, final=final)
            if decision is None:
                self._wait(i, code_ticks)
                return None
            is_boundary, unit_end = decision
            if is_boundary and unit_end <= limit:
                return unit_end, unit_end
            i = unit_end
        if n > limit:
            end = self._forced_cut(text)
            return end, end
        if final:
            return n, n
        self._wait(i, code_ticks)
        return None

    def _after_first_letters(self, text: str, stop: int) -> int:
        """Where the segment has min_first_chars letters or digits (``stop``: not before it)."""
        while self._letters < self._min_first_chars:
            found = _LETTER_OR_DIGIT.search(text, self._letters_to, stop)
            if found is None:
                self._letters_to = stop
                return stop
            self._letters += 1
            self._letters_to = found.end()
        return self._letters_to

    def _wait(self, scan: int, code_ticks: int) -> None:
        self._scan = scan
        self._code_ticks = code_ticks

    def _decide(self, text: str, i: int, *, final: bool) -> tuple[bool, int] | None:
        """Is the punctuation at ``i`` a boundary? Returns (answer, end of the unit) or None."""
        n = len(text)
        horizon = self._max_chars + 1  # a unit reaching this far cannot end the segment
        is_comma = text[i] in _COMMA_MARKS
        run_end = i + 1 if is_comma else _ENDER_RUN_PATTERN.match(text, i, horizon).end()
        unit_end = _CLOSER_RUN.match(text, run_end, horizon).end()
        if unit_end > self._max_chars:
            return False, unit_end
        if unit_end == n and not final:
            return None
        run = text[i:run_end]
        after = text[unit_end] if unit_end < n else ""
        ascii_run = run.isascii()
        if ascii_run and after and not after.isspace():
            if _URL_IN_TOKEN.search(text, 0, i):
                return False, unit_end  # "?q=1", "x.com/a.b": punctuation inside a URL
            joined = unit_end == run_end and after.isascii() and after not in _PUNCTUATION_AFTER
            if joined and (is_comma or set(run) == {"."}):
                return False, unit_end  # 3.14, e.g, a.b@x.com, ../dir, 12:30, 1,000
        if is_comma:
            letters = len(_LETTER_OR_DIGIT.findall(clean_for_speech(text[:i])))
            return letters >= self._min_first_chars, unit_end
        if not ascii_run or any(ch in _SENTENCE_ENDERS for ch in run) or len(run) > 1:
            return True, unit_end  # 。！？!?；; or an ellipsis
        return self._decide_period(text, i, unit_end, final=final)

    def _decide_period(self, text: str, i: int, unit_end: int, *, final: bool) -> tuple[bool, int] | None:
        if _LIST_NUMBER.fullmatch(text, 0, i):
            return False, unit_end  # "1." opening a list item: a segment is never just a number
        n = len(text)
        # Look at most max_chars spaces ahead; a longer gap counts as the end of the text.
        gap_end = unit_end + self._max_chars
        next_visible = _SPACE_RUN.match(text, unit_end, gap_end).end()
        if next_visible == n and not final and n < gap_end:
            return None
        following = text[next_visible] if next_visible < min(n, gap_end) else ""
        word = _WORD_BEFORE_DOT.search(text, 0, i)
        if word is not None:
            abbreviation = word.group(0).lower() + "."
            if abbreviation in _NUMBER_ABBREVIATIONS:
                if following.isdigit():
                    return False, unit_end
            elif abbreviation in _ABBREVIATIONS or _DOTTED_ACRONYM.fullmatch(word.group(0)):
                return False, unit_end
        if next_visible > unit_end and following.isascii() and following.islower():
            return False, unit_end  # "approx. five": a sentence does not start lower-case
        return True, unit_end

    def _forced_cut(self, text: str) -> int:
        limit = self._max_chars
        for q in range(limit - 1, 0, -1):
            if text[q] in _SOFT_CUTS or text[q].isspace():
                return q + 1
        boundaries = [m.end() for m in _GRAPHEME.finditer(text, 0, limit + 1)]
        fitting = [b for b in boundaries if b <= limit]
        return fitting[-1] if fitting else boundaries[0]

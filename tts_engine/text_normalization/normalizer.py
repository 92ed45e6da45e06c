"""Text normalisation (TN): numbers, dates, times, units, money... written out as they are read aloud.

CosyVoice reads what it is given, so "2026-11-24" must reach it as "二零二六年十一月二十四日".
Upstream runs WeTextProcessing first; so do we, through ``wetext`` (the maintained runtime of
WeTextProcessing on ``kaldifst``: no pynini, and its wheel ships the compiled FSTs, so nothing is
downloaded or built at run time). Modes (``tts.text_normalization``):

* ``wetext``: the library's Chinese or English TN, with our rules only where it has none or reads
  wrongly (:mod:`tts_engine.text_normalization.wetext_rules` lists them). When ``wetext`` is not installed,
  ``basic`` is used and a warning logged (the engine worker must import without it: the GPU machine has
  only torch, onnxruntime, tokenizers, safetensors and transformers).
* ``basic``: our own small normaliser (:mod:`cosyvoice.text.numbers`: times, money, percent, decimals,
  years, ordinals, integers; no units or dates).
* ``off``: the text is left as it is.

Language is chosen per sentence: Chinese TN for a sentence with a CJK ideograph (it reads
"iPhone 15 Pro售价7999元" as "iPhone 十五 Pro售价七千九百九十九元", as a Chinese speaker does),
English TN otherwise. A text with ``<|...|>`` markup is never normalised (as upstream). The FSTs
load when the normaliser is built (at server start-up), about 0.3 s and 50 MB once per process.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Literal, get_args

from cosyvoice.text.numbers import spell_numbers_en, spell_numbers_zh
from tts_engine.text_normalization import wetext_rules

__all__ = ["TextNormalization", "TextNormalizer", "split_sentences"]

log = logging.getLogger(__name__)

TextNormalization = Literal["wetext", "basic", "off"]
_MODES: tuple[str, ...] = get_args(TextNormalization)
_CJK = re.compile(r"[\u4e00-\u9fff]")
# A sentence ends after 。！？；!?; or a newline, or after a "." that a blank follows ("3.5" stays).
_SENTENCE_END = re.compile(r"(?<=[。！？；!?;\n])(?![。！？；!?;\n”\"'’）)])|(?<=\.)(?=\s)")
_EDGES = re.compile(r"(\s*)(.*?)(\s*)", re.DOTALL)
# The FSTs cost about 75 us a character (Chinese) and 45 (English), whatever the text holds, so
# they only see the parts that can change: Chinese clauses (cut after ，、；：) with a digit, and
# English sentences with a digit, a symbol wetext reads, or a capitalised abbreviation ("Dr.").
_ZH_CLAUSE_END = re.compile(r"(?<=[，、；：])")
_DIGIT = re.compile(r"[0-9]")
_EN_NEEDS_TN = re.compile(r"[0-9$€£¥%&@#°℃+=×]|\b[A-Z][a-z]{1,3}\.")
# One FST call holds the GIL throughout (kaldifst does not release it) and costs more than linearly
# (about 9 ms for 100 characters, 50 ms for 400), so longer pieces are cut where no number, date or
# unit can span: between two Chinese characters, or at a blank between two Latin letters. A piece
# with no such place (a 4,000-digit run) goes to the basic normaliser, which is linear.
MAX_FST_CHARS = 100
_ZH_CUT = re.compile(r"(?<=[\u4e00-\u9fff])(?=[\u4e00-\u9fff])")
_EN_CUT = re.compile(r"(?<=[A-Za-z]) (?=[A-Za-z])")


def split_sentences(text: str) -> list[str]:
    """Cut ``text`` after each sentence end; joining the pieces gives ``text`` back."""
    return [piece for piece in _SENTENCE_END.split(text) if piece]


class TextNormalizer:
    """Callable ``text -> text`` for one mode; build it once per process (the FSTs load here)."""

    def __init__(self, mode: str = "wetext") -> None:
        if mode not in _MODES:
            raise ValueError(f"text normalization must be one of {', '.join(_MODES)}, got {mode!r}")
        self.requested = mode
        self._zh: Callable[[str], str] | None = None
        self._en: Callable[[str], str] | None = None
        self._warned = False
        if mode == "wetext":
            try:
                from wetext import Normalizer  # imports load every FST the package ships
            except ImportError as exc:
                log.warning(
                    "tts.text_normalization is wetext but the wetext package cannot be imported (%s); "
                    "using our basic normaliser instead (pip install wetext)",
                    exc,
                )
                mode = "basic"
            else:
                # As upstream CosyVoice: zh keeps erhua; both TN ("tn" is the default operator).
                self._zh = Normalizer(lang="zh", operator="tn", remove_erhua=False).normalize
                self._en = Normalizer(lang="en", operator="tn").normalize
        self.mode: TextNormalization = mode  # type: ignore[assignment]

    def __call__(self, text: str) -> str:
        if self.mode == "off" or not text or ("<|" in text and "|>" in text):
            return text
        return "".join(self._sentence(piece) for piece in split_sentences(text))

    def _sentence(self, sentence: str) -> str:
        lead, core, trail = _EDGES.fullmatch(sentence).groups()  # type: ignore[union-attr]
        if not core:
            return sentence
        zh = _CJK.search(core) is not None
        if self.mode == "basic":
            return lead + (spell_numbers_zh(core) if zh else spell_numbers_en(core)) + trail
        try:
            spoken = self._wetext_zh(core) if zh else self._wetext_en(core)
        except Exception as exc:  # the library asserts on a few inputs ("+1 555 123 4567")
            if not self._warned:
                self._warned = True
                log.warning(
                    "wetext failed on %r (%s); that sentence uses the basic normaliser", core[:60], exc
                )
            return lead + (spell_numbers_zh(core) if zh else spell_numbers_en(core)) + trail
        return lead + spoken + trail

    def _wetext_zh(self, sentence: str) -> str:
        fst = self._zh or spell_numbers_zh
        spoken = []
        for clause in _ZH_CLAUSE_END.split(wetext_rules.before_zh(sentence)):
            for piece in _pieces(clause, _ZH_CUT):
                if _DIGIT.search(piece):
                    piece = _keep_edges(piece, fst if len(piece) <= MAX_FST_CHARS else spell_numbers_zh)
                spoken.append(piece)
        return wetext_rules.after_zh("".join(spoken))

    def _wetext_en(self, sentence: str) -> str:
        fst = self._en or spell_numbers_en
        spoken = []
        for piece in _pieces(wetext_rules.before_en(sentence), _EN_CUT):
            if _EN_NEEDS_TN.search(piece):
                piece = _keep_edges(piece, fst if len(piece) <= MAX_FST_CHARS else spell_numbers_en)
            spoken.append(piece)
        return wetext_rules.after_en("".join(spoken))


def _pieces(text: str, cut: re.Pattern[str]) -> list[str]:
    """``text`` in pieces of at most MAX_FST_CHARS, cut at ``cut`` (a piece with no cut stays long)."""
    pieces = []
    while len(text) > MAX_FST_CHARS:
        cuts = [match.start() for match in cut.finditer(text, 1, MAX_FST_CHARS + 1)]
        if not cuts:
            break
        pieces.append(text[: cuts[-1]])
        text = text[cuts[-1] :]
    pieces.append(text)
    return pieces


def _keep_edges(text: str, normalize: Callable[[str], str]) -> str:
    """``normalize`` strips its input; put the blanks around it back."""
    lead, core, trail = _EDGES.fullmatch(text).groups()  # type: ignore[union-attr]
    return lead + normalize(core) + trail if core else text

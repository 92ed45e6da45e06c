"""CosyVoice3 text side: prompt layouts for the LLM, text normalisation and sentence splitting.

Prompt layouts (the v3 LLM input is ``sos, embed(prompt_text ++ text), task_id, prompt speech``):

* zero-shot: prompt_text = ``"You are a helpful assistant.<|endofprompt|>" + transcript`` (no space
  after the period), and the LLM sees the prompt speech tokens;
* cross-lingual: no prompt_text; the tts text itself starts with that prefix; no prompt speech for
  the LLM (the flow still gets the prompt);
* instruct: prompt_text = ``"You are a helpful assistant. " + instruction + "<|endofprompt|>"`` (with
  a space), no prompt speech for the LLM.

Normalisation follows the upstream frontend's order of steps. Its first step, reading numbers, dates,
units... as words (wetext upstream), is :mod:`tts_engine.text_normalization` (wetext, or our basic
:mod:`cosyvoice.text.numbers`); the TTS engine applies it to every request before the backend sees the
text, so the backend calls these functions with ``spell_numbers=False``. Called directly (scripts,
:mod:`cosyvoice.model`), they spell numbers with the basic normaliser. Texts containing both ``<|``
and ``|>`` are never normalised or split, exactly as upstream, so every v3 prompt passes through intact.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from cosyvoice.text.numbers import spell_numbers_en, spell_numbers_zh
from cosyvoice.text.tokenizer import ENDOFPROMPT

__all__ = [
    "INSTRUCT_PREFIX",
    "PROMPT_PREFIX",
    "LLMTextInput",
    "PromptMode",
    "TextError",
    "build_llm_text",
    "contains_chinese",
    "cross_lingual_text",
    "instruct_prompt",
    "is_only_punctuation",
    "normalize_text",
    "prepare_tts_texts",
    "split_paragraph",
    "zero_shot_prompt",
]

PROMPT_PREFIX = "You are a helpful assistant."  # zero-shot and cross-lingual, then <|endofprompt|>
INSTRUCT_PREFIX = "You are a helpful assistant. "  # instruct strings have a space after the period

_ZH_SENTENCE_ENDS = frozenset("。？！；：、.?!;")
_EN_SENTENCE_ENDS = frozenset(".?!;:")
_CLOSING_QUOTES = frozenset('"”')
_CHINESE_CHAR = re.compile(r"[\u4e00-\u9fff]")


class TextError(ValueError):
    """A text or prompt argument cannot be used (empty where required, missing <|endofprompt|>, ...)."""


class Encoder(Protocol):
    def encode(self, text: str) -> list[int]: ...


class PromptMode(StrEnum):
    ZERO_SHOT = "zero_shot"
    CROSS_LINGUAL = "cross_lingual"
    INSTRUCT = "instruct"


@dataclass(frozen=True, slots=True, kw_only=True)
class LLMTextInput:
    """Token ids for one LLM request. Only ``text_ids`` count for the min/max generation length."""

    prompt_text_ids: tuple[int, ...]
    text_ids: tuple[int, ...]
    use_prompt_speech: bool  # whether the LLM prefix includes the prompt speech tokens


def zero_shot_prompt(transcript: str) -> str:
    """The zero-shot prompt_text for a prompt recording's transcript (kept as is if already a prompt)."""
    return transcript if ENDOFPROMPT in transcript else PROMPT_PREFIX + ENDOFPROMPT + transcript


def cross_lingual_text(text: str) -> str:
    """The cross-lingual tts text: ``text`` behind the standard prefix (kept as is if it has one)."""
    return text if ENDOFPROMPT in text else PROMPT_PREFIX + ENDOFPROMPT + text


def instruct_prompt(instruction: str) -> str:
    """The instruct prompt_text: e.g. ``"请用广东话表达。"`` -> ``"You are a helpful assistant. 请用广东话表达。<|endofprompt|>"``."""
    instruction = instruction.strip()
    if not instruction:
        raise TextError("instruction must not be empty")
    if ENDOFPROMPT in instruction:
        return instruction
    return INSTRUCT_PREFIX + instruction + ENDOFPROMPT


def build_llm_text(
    tokenizer: Encoder,
    mode: PromptMode,
    text: str,
    *,
    transcript: str | None = None,
    instruction: str | None = None,
) -> LLMTextInput:
    """Tokenize one (already normalised) tts text segment with the prompt layout of ``mode``.

    ``transcript`` (zero-shot) is the prompt recording's text; ``instruction`` (instruct) the style
    request. prompt_text and text are tokenized separately and concatenated, as upstream does.
    """
    try:
        mode = PromptMode(mode)
    except ValueError as exc:
        raise TextError(f"unknown prompt mode {mode!r}") from exc
    if not text:
        raise TextError("text must not be empty")
    if mode is PromptMode.ZERO_SHOT:
        if transcript is None:
            raise TextError("zero-shot mode needs the prompt transcript")
        prompt_text, use_prompt_speech = zero_shot_prompt(transcript), True
    elif mode is PromptMode.INSTRUCT:
        if instruction is None:
            raise TextError("instruct mode needs an instruction")
        prompt_text, use_prompt_speech = instruct_prompt(instruction), False
    else:
        prompt_text, text, use_prompt_speech = "", cross_lingual_text(text), False
    prompt_ids = tuple(tokenizer.encode(prompt_text)) if prompt_text else ()
    text_ids = tuple(tokenizer.encode(text))
    endofprompt_ids = tokenizer.encode(ENDOFPROMPT)
    if len(endofprompt_ids) != 1 or endofprompt_ids[0] not in prompt_ids + text_ids:
        raise TextError(f"the LLM text must contain {ENDOFPROMPT}")
    return LLMTextInput(prompt_text_ids=prompt_ids, text_ids=text_ids, use_prompt_speech=use_prompt_speech)


def contains_chinese(text: str) -> bool:
    return _CHINESE_CHAR.search(text) is not None


def is_only_punctuation(text: str) -> bool:
    """True for an empty string or one made only of punctuation and symbols (Unicode P* / S*)."""
    return all(unicodedata.category(char)[0] in "PS" for char in text)


def _remove_blanks_between_non_ascii(text: str) -> str:
    """Keep a space only when both neighbours are non-space ASCII characters."""
    kept = []
    for i, char in enumerate(text):
        if char == " ":
            before = text[i - 1] if i > 0 else " "
            after = text[i + 1] if i + 1 < len(text) else " "
            if not (before.isascii() and before != " " and after.isascii() and after != " "):
                continue
        kept.append(char)
    return "".join(kept)


def _normalize_chinese(text: str, spell_numbers: bool) -> str:
    text = (spell_numbers_zh(text) if spell_numbers else text).replace("\n", "")
    text = _remove_blanks_between_non_ascii(text)
    text = text.replace("²", "平方").replace("³", "立方")
    text = text.replace(".", "。").replace(" - ", "，")
    for bracket in ("（", "）", "【", "】", "`"):
        text = text.replace(bracket, "")
    text = text.replace("——", " ")
    return re.sub(r"[，,、]+$", "。", text)


def normalize_text(text: str, *, spell_numbers: bool = True) -> str:
    """Normalise one tts text (no splitting); texts with ``<|...|>`` markup are returned unchanged.

    ``spell_numbers=False`` skips the basic number reading (the text was normalised before).
    """
    if ("<|" in text and "|>" in text) or not text:
        return text
    text = text.strip()
    if contains_chinese(text):
        return _normalize_chinese(text, spell_numbers)
    return spell_numbers_en(text) if spell_numbers else text


def split_paragraph(
    text: str,
    *,
    lang: str,
    encode: Callable[[str], Sequence[int]],
    max_len: int = 80,
    min_len: int = 60,
    merge_len: int = 20,
) -> list[str]:
    """Split at sentence ends and pack sentences greedily into segments of about ``max_len``.

    Length is characters for ``lang="zh"`` and tokens otherwise. A segment is emitted when adding
    the next sentence would exceed ``max_len`` and the segment already exceeds ``min_len``; a last
    segment shorter than ``merge_len`` joins the previous one. Closing quotes stay with their sentence.
    """
    if not text:
        return []
    ends = _ZH_SENTENCE_ENDS if lang == "zh" else _EN_SENTENCE_ENDS

    def length(piece: str) -> int:
        return len(piece) if lang == "zh" else len(encode(piece))

    if text[-1] not in ends:
        text += "。" if lang == "zh" else "."
    sentences: list[str] = []
    start = 0
    for i, char in enumerate(text):
        if char not in ends:
            continue
        if i > start:
            sentences.append(text[start : i + 1])
        start = i + 1
        if i + 1 < len(text) and text[i + 1] in _CLOSING_QUOTES and sentences:
            sentences[-1] += text[i + 1]
            start = i + 2
    segments: list[str] = []
    current = ""
    for sentence in sentences:
        if length(current + sentence) > max_len and length(current) > min_len:
            segments.append(current)
            current = ""
        current += sentence
    if current:
        if segments and length(current) < merge_len:
            segments[-1] += current
        else:
            segments.append(current)
    return segments


def prepare_tts_texts(
    text: str, encode: Callable[[str], Sequence[int]], *, spell_numbers: bool = True
) -> list[str]:
    """The upstream frontend's tts-text pipeline: normalise, split, drop punctuation-only segments.

    A text with ``<|...|>`` markup (every cross-lingual text) or an empty text comes back as the
    single unchanged segment. ``spell_numbers=False``: see :func:`normalize_text`.
    """
    if ("<|" in text and "|>" in text) or not text:
        return [text]
    normalized = normalize_text(text, spell_numbers=spell_numbers)
    lang = "zh" if contains_chinese(normalized) else "en"
    segments = split_paragraph(normalized, lang=lang, encode=encode)
    return [segment for segment in segments if not is_only_punctuation(segment)]

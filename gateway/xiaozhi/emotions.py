"""The emotion names the firmware's emoji sets know, and the emoji that stand for them.

Source: section 4.5 of docs/xiaozhi-protocol.md (78/xiaozhi-fonts ``font_emoji.py``). The device
reads only the emotion *name* of an ``llm`` message; the emoji is for web clients and for finding an
emotion in LLM output, the way the incumbent does.
"""

from __future__ import annotations

EMOTIONS: dict[str, str] = {
    "neutral": "\U0001f636",  # 😶
    "happy": "\U0001f642",  # 🙂
    "laughing": "\U0001f606",  # 😆
    "funny": "\U0001f602",  # 😂
    "sad": "\U0001f614",  # 😔
    "angry": "\U0001f620",  # 😠
    "crying": "\U0001f62d",  # 😭
    "loving": "\U0001f60d",  # 😍
    "embarrassed": "\U0001f633",  # 😳
    "surprised": "\U0001f62f",  # 😯
    "shocked": "\U0001f631",  # 😱
    "thinking": "\U0001f914",  # 🤔
    "winking": "\U0001f609",  # 😉
    "cool": "\U0001f60e",  # 😎
    "relaxed": "\U0001f60c",  # 😌
    "delicious": "\U0001f924",  # 🤤
    "kissy": "\U0001f618",  # 😘
    "confident": "\U0001f60f",  # 😏
    "sleepy": "\U0001f634",  # 😴
    "silly": "\U0001f61c",  # 😜
    "confused": "\U0001f644",  # 🙄
}

DEFAULT_EMOTION: tuple[str, str] = (EMOTIONS["happy"], "happy")
"""(emoji, emotion) used when a reply carries no known emoji, as the incumbent does."""

# Emoji -> name. The incumbent maps 😲 (U+1F632) to "surprised" as well as the font's 😯.
_EMOTION_BY_EMOJI: dict[str, str] = {emoji: name for name, emoji in EMOTIONS.items()}
_EMOTION_BY_EMOJI["\U0001f632"] = "surprised"


def emotion_for_emoji(ch: str) -> str | None:
    """Return the emotion name for one emoji character, or None if it is not a known one.

    A trailing variation selector (U+FE0F) is tolerated.
    """
    return _EMOTION_BY_EMOJI.get(ch.removesuffix("\ufe0f"))


def find_emotion(text: str) -> tuple[str, str] | None:
    """Return (emoji, emotion) for the first known emoji in ``text``, or None if there is none."""
    for ch in text:
        name = _EMOTION_BY_EMOJI.get(ch)
        if name is not None:
            return ch, name
    return None


def is_emotion(name: str) -> bool:
    """True if ``name`` is one of the emotion names the firmware knows."""
    return name in EMOTIONS

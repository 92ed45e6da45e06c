"""The voice a device session speaks in: one ``VoiceChoice`` per session, the value's one owner.

It starts as the configured voice (``tts.voice``; None: the engine's default), or the voice of the
device's agent, which a turn sets when the agent's voice changed (gateway/speech/turns.py). The
``change_voice`` tool sets another for what follows (gateway/device/session_tools.py holds the same
object, so the change does not travel up to the session and back down); every sentence's synthesis
reads ``current``. Whether the engine offers it is the engine's to say, once, when the sentence is
queued (``SpeechEngine.resolve_voice`` inside ``synthesize``).

``TurnVoice`` is one reply's view of it: the session's choice (still read at each sentence, so a tool
call mid-reply counts), with the agent's speed and CosyVoice3 instruct text; an agent with expressive
speech sets the instruct text from the reply's emotion before its first sentence.
"""

from __future__ import annotations

from typing import Protocol


class SpeakingVoice(Protocol):
    """What a sentence's synthesis reads (gateway/speech/speaker.py)."""

    @property
    def current(self) -> str | None: ...

    @property
    def speed(self) -> float: ...

    @property
    def instruct(self) -> str | None: ...


class VoiceChoice:
    speed = 1.0
    instruct: str | None = None

    def __init__(self, current: str | None = None) -> None:
        self.current = current

    def change(self, name: str | None) -> None:
        self.current = name

    def __repr__(self) -> str:
        return f"VoiceChoice({self.current!r})"


class TurnVoice:
    def __init__(self, choice: VoiceChoice, *, speed: float = 1.0, instruct: str | None = None) -> None:
        self.choice = choice
        self.speed = speed
        self.instruct = instruct or None

    @property
    def current(self) -> str | None:
        return self.choice.current

    def __repr__(self) -> str:
        return f"TurnVoice({self.current!r}, speed={self.speed}, instruct={self.instruct!r})"

"""The voice a device session speaks in: one ``VoiceChoice`` per session, the value's one owner.

It starts as the configured voice (``tts.voice``; None: the engine's default). The ``change_voice``
tool sets another for what follows (gateway/device/session_tools.py holds the same object, so the change does
not travel up to the session and back down); every sentence's synthesis reads ``current``. Whether
the engine offers it is the engine's to say, once, when the sentence is queued
(``SpeechEngine.resolve_voice`` inside ``synthesize``).
"""

from __future__ import annotations


class VoiceChoice:
    def __init__(self, current: str | None = None) -> None:
        self.current = current

    def change(self, name: str) -> None:
        self.current = name

    def __repr__(self) -> str:
        return f"VoiceChoice({self.current!r})"

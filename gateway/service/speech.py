"""Speech for an account: from the audio cache when the same request was answered before, else from the
engine in the account's priority class (recorded into the cache as it streams)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.service import engine_requests
from gateway.service.accounts import Account
from gateway.service.cache import AudioCache, prompt_hash, voice_revision
from gateway.service.engine_requests import Priority
from tts_engine.interface import SpeechEngine, SpeechStream

if TYPE_CHECKING:
    from gateway.voices.store import VoiceStore

__all__ = ["open_speech", "open_zero_shot"]


async def open_speech(
    engine: SpeechEngine,
    cache: AudioCache | None,
    voices: VoiceStore | None,
    account: Account,
    text: str,
    *,
    voice: str,
    output_rate: int,
    speed: float = 1.0,
    instruct: str | None = None,
    paced: bool = True,
    priority: Priority | None = None,
) -> tuple[SpeechStream, bool | None]:
    """(the stream, True for a cache hit / False for a miss / None when the cache was not asked)."""
    key = None
    if cache is not None and cache.enabled and account.cache:
        key = cache.key(text, voice=voice, voice_revision=voice_revision(voices, voice), speed=speed,
                        instruct=instruct, output_rate=output_rate)  # fmt: skip
        entry = await cache.lookup(key)
        if entry is not None:
            return cache.replay(entry, paced=paced), True
    stream = engine_requests.synthesize(engine, text, priority=priority or account.priority, voice=voice,
                                        output_rate=output_rate, speed=speed, instruct=instruct)  # fmt: skip
    if cache is None or key is None:
        return stream, None
    return cache.recording(stream, key=key, voice=voice), False


async def open_zero_shot(
    engine: SpeechEngine,
    cache: AudioCache | None,
    account: Account,
    text: str,
    *,
    prompt_wav: bytes,
    prompt_text: str,
    output_rate: int,
    speed: float = 1.0,
    instruct: str | None = None,
) -> tuple[SpeechStream, bool | None]:
    """Like ``open_speech`` in a voice cloned for this request: cached under its prompt's hash."""
    key = None
    if cache is not None and cache.enabled and account.cache:
        key = cache.key(text, voice="", voice_revision="zero-shot", speed=speed, instruct=instruct,
                        output_rate=output_rate, prompt_hash=prompt_hash(prompt_wav, prompt_text))  # fmt: skip
        entry = await cache.lookup(key)
        if entry is not None:
            return cache.replay(entry), True
    stream = engine_requests.synthesize_zero_shot(
        engine, text, priority=account.priority, prompt_wav=prompt_wav, prompt_text=prompt_text,
        output_rate=output_rate, speed=speed, instruct=instruct,
    )  # fmt: skip
    if cache is None or key is None:
        return stream, None
    return cache.recording(stream, key=key, voice=""), False

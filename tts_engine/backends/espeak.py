"""Real speech with no model: the espeak-ng command-line synthesiser.

``open_stream()`` starts one ``espeak-ng --stdout`` process per request at once, with the text on stdin
and the WAV written to an anonymous temporary file, so several sentences synthesise in parallel on the
OS and a long text can never dead-lock on a full pipe. ``next_chunk()`` waits for that process (at most
``timeout_s`` from the start), parses the WAV with the standard ``wave`` module and hands it out in
``chunk_ms`` pieces. espeak-ng runs far faster than real time, so waiting for the whole sentence costs
little latency.

Voices: each exposed name maps to an espeak-ng voice; the value ``"auto"`` picks Mandarin (``cmn``) when
the text holds CJK ideographs and American English (``en-us``) otherwise.
"""

from __future__ import annotations

import contextlib
import io
import re
import shutil
import subprocess
import tempfile
import time
import wave

import numpy as np

from tts_engine.backends.base import Backend, BackendStream
from tts_engine.errors import EngineError

AUTO_VOICE = "auto"
DEFAULT_VOICES: dict[str, str] = {"default": AUTO_VOICE, "zh": "cmn", "en": "en-us"}
_MANDARIN = "cmn"
_ENGLISH = "en-us"
_MIN_WPM, _MAX_WPM = 80, 500  # espeak-ng's own range for -s
_CJK_RE = re.compile("[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002ffff]")
_PROBE_TIMEOUT_S = 10.0


class EspeakError(RuntimeError):
    """espeak-ng failed for one request (non-zero exit, timeout, unexpected WAV)."""


def resolve_voice(espeak_voice: str, text: str) -> str:
    """The espeak-ng voice to use for ``text``; resolves ``"auto"`` by the script of the text."""
    if espeak_voice != AUTO_VOICE:
        return espeak_voice
    return _MANDARIN if _CJK_RE.search(text) else _ENGLISH


def decode_wav(data: bytes) -> tuple[np.ndarray, int]:
    """Parse espeak-ng's 16-bit mono WAV into float32 samples in [-1, 1] and the sample rate.

    espeak-ng writes a streaming header (data size 0x7fffffff); ``wave`` reads up to the real end.
    No bytes at all means no audio (espeak-ng writes nothing for empty input).
    """
    if not data:
        return np.zeros(0, dtype=np.float32), 0
    try:
        with wave.open(io.BytesIO(data)) as wav:
            if wav.getnchannels() != 1 or wav.getsampwidth() != 2:
                raise EspeakError(
                    f"espeak-ng wrote {wav.getnchannels()} channel(s) of {wav.getsampwidth()} bytes; "
                    "expected 16-bit mono"
                )
            frames = wav.readframes(wav.getnframes())
            sample_rate = wav.getframerate()
    except (wave.Error, EOFError) as exc:
        raise EspeakError(f"espeak-ng wrote an unreadable WAV: {exc}") from exc
    pcm = np.frombuffer(frames[: len(frames) // 2 * 2], dtype="<i2").astype(np.float32) / 32768.0
    return pcm, sample_rate


class EspeakStream(BackendStream):
    """One espeak-ng process and its output."""

    def __init__(self, args: list[str], text: str, *, sample_rate: int, chunk_samples: int, timeout_s: float):
        self._sample_rate = sample_rate
        self._chunk_samples = chunk_samples
        self._deadline = time.monotonic() + timeout_s
        self._timeout_s = timeout_s
        self._stdout = tempfile.TemporaryFile()
        self._stderr = tempfile.TemporaryFile()
        self._pcm: np.ndarray | None = None
        self._pos = 0
        self._proc: subprocess.Popen[bytes] | None = None
        try:
            self._proc = subprocess.Popen(
                args, stdin=subprocess.PIPE, stdout=self._stdout, stderr=self._stderr
            )
        except OSError:
            self.close()
            raise
        self._feed_stdin(self._proc, text)

    @staticmethod
    def _feed_stdin(proc: subprocess.Popen[bytes], text: str) -> None:
        # stdout goes to a file, so espeak-ng never blocks on output and always drains stdin.
        if proc.stdin is None:
            return
        try:
            proc.stdin.write(text.encode("utf-8", "replace"))
        except BrokenPipeError:
            pass  # the process died at once; next_chunk() reports its exit status
        finally:
            with contextlib.suppress(BrokenPipeError):
                proc.stdin.close()

    def _collect(self) -> np.ndarray:
        proc = self._proc
        if proc is None:
            raise EspeakError("stream is closed")
        try:
            returncode = proc.wait(timeout=max(0.0, self._deadline - time.monotonic()))
        except subprocess.TimeoutExpired as exc:
            self.close()
            raise EspeakError(f"espeak-ng did not finish within {self._timeout_s:g} s") from exc
        if returncode != 0:
            self._stderr.seek(0)
            message = self._stderr.read().decode("utf-8", "replace").strip()
            raise EspeakError(f"espeak-ng exited with status {returncode}: {message or 'no message'}")
        self._stdout.seek(0)
        pcm, rate = decode_wav(self._stdout.read())
        if pcm.size and rate != self._sample_rate:
            raise EspeakError(f"espeak-ng wrote {rate} Hz audio; this backend runs at {self._sample_rate} Hz")
        return pcm

    def next_chunk(self) -> np.ndarray | None:
        if self._pcm is None:
            self._pcm = self._collect()
            self._release_files()
        if self._pos >= self._pcm.size:
            return None
        chunk = self._pcm[self._pos : self._pos + self._chunk_samples]
        self._pos += chunk.size
        return chunk

    def _release_files(self) -> None:
        self._stdout.close()
        self._stderr.close()

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        self._release_files()


class EspeakBackend(Backend):
    """Speech through the espeak-ng CLI (22050 Hz on standard builds; probed at construction)."""

    name = "espeak"

    def __init__(
        self,
        *,
        executable: str = "espeak-ng",
        rate_wpm: int = 175,
        voices: dict[str, str] | None = None,
        timeout_s: float = 10.0,
        chunk_ms: int = 200,
    ) -> None:
        path = shutil.which(executable)
        if path is None:
            raise EngineError(f"{executable} not found; install it with apt-get install espeak-ng")
        if not _MIN_WPM <= rate_wpm <= _MAX_WPM:
            raise ValueError(f"rate_wpm must be in [{_MIN_WPM}, {_MAX_WPM}], got {rate_wpm}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        if chunk_ms <= 0:
            raise ValueError(f"chunk_ms must be positive, got {chunk_ms}")
        voice_map = dict(DEFAULT_VOICES if voices is None else voices)
        if not voice_map:
            raise ValueError("voices must map at least one name to an espeak-ng voice")
        self.executable = path
        self.rate_wpm = rate_wpm
        self.timeout_s = timeout_s
        self.chunk_ms = chunk_ms
        self._voice_map = voice_map
        self.default_voice = "default" if "default" in voice_map else next(iter(voice_map))
        self.sample_rate = self._probe_sample_rate()

    def _probe_sample_rate(self) -> int:
        """Synthesise one word with each configured espeak-ng voice: checks they exist, reads the rate."""
        rates: set[int] = set()
        espeak_voices = {v for v in self._voice_map.values() if v != AUTO_VOICE}
        if AUTO_VOICE in self._voice_map.values():
            espeak_voices |= {_MANDARIN, _ENGLISH}
        for espeak_voice in sorted(espeak_voices):
            try:
                done = subprocess.run(
                    [self.executable, "--stdout", "-v", espeak_voice],
                    input=b"a",
                    capture_output=True,
                    timeout=_PROBE_TIMEOUT_S,
                    check=False,
                )
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise EngineError(f"cannot run {self.executable}: {exc}") from exc
            if done.returncode != 0:
                message = done.stderr.decode("utf-8", "replace").strip()
                raise EngineError(f"espeak-ng voice {espeak_voice!r} does not work: {message}")
            try:
                rates.add(decode_wav(done.stdout)[1])
            except EspeakError as exc:
                raise EngineError(str(exc)) from exc
        if len(rates) != 1 or 0 in rates:
            raise EngineError(f"espeak-ng voices disagree on the sample rate (or wrote no audio): {rates}")
        return rates.pop()

    def voices(self) -> list[str]:
        return list(self._voice_map)

    def wpm_for(self, speed: float) -> int:
        """espeak-ng's words per minute for a speed factor (clamped to what espeak-ng accepts)."""
        return min(_MAX_WPM, max(_MIN_WPM, round(self.rate_wpm * speed)))

    def command_for(self, text: str, voice: str, speed: float) -> list[str]:
        """The espeak-ng command line for one request; the text itself goes on stdin."""
        if voice not in self._voice_map:
            raise ValueError(f"unknown voice {voice!r}")
        espeak_voice = resolve_voice(self._voice_map[voice], text)
        return [self.executable, "--stdout", "-v", espeak_voice, "-s", str(self.wpm_for(speed))]

    def open_stream(self, text: str, voice: str, speed: float) -> EspeakStream:
        return EspeakStream(
            self.command_for(text, voice, speed),
            text,
            sample_rate=self.sample_rate,
            chunk_samples=max(1, round(self.sample_rate * self.chunk_ms / 1000)),
            timeout_s=self.timeout_s,
        )

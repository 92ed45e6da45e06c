"""Real speech with no model: the espeak-ng command-line synthesiser.

Each request runs one ``espeak-ng --stdout`` process, with the text on stdin and the WAV written to an
anonymous temporary file, so a long text can never dead-lock on a full pipe. The process's WAV is parsed
with the standard ``wave`` module and handed out in ``chunk_ms`` pieces. espeak-ng runs far faster than
real time, so waiting for the whole sentence costs little latency.

Many requests at once (a burst of devices starting a turn together) are the hard case, and ``step()``
handles it so that audio already synthesised is never held up by synthesis still running:

* At most ``max_processes`` (default: the CPU count) espeak-ng processes run at a time, started in the
  order the engine ranks the streams (least playback slack first: first sentences before look-ahead
  ones), at a lower CPU priority (``nice``) than the server. Fifty processes sharing two cores would all
  finish late together and starve the event loop that paces the audio; a few at a time finish in order.
* A step never waits for one process while another stream has audio ready: every open stream is in
  every step (``max_batch_size``), ready streams get their next chunk, the others an empty one. Only when no stream in the batch has anything does the step block,
  until the first process of any stream ends (a pidfd per process, no polling) or a deadline passes.

``open_stream()`` itself only records the request; a stream used on its own (``next_chunk()`` without
``step()``) starts its process at once and waits for it. ``timeout_s`` counts from the process start.

Voices: each exposed name maps to an espeak-ng voice; the value ``"auto"`` picks Mandarin (``cmn``) when
the text holds CJK ideographs and American English (``en-us``) otherwise.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import select
import shutil
import subprocess
import tempfile
import time
import wave
from typing import IO

import numpy as np

from tts_engine.backends.base import Backend, BackendStream
from tts_engine.budget import UNCAPPED, StepBudget
from tts_engine.errors import EngineError

AUTO_VOICE = "auto"
DEFAULT_VOICES: dict[str, str] = {"default": AUTO_VOICE, "zh": "cmn", "en": "en-us"}
_MANDARIN = "cmn"
_ENGLISH = "en-us"
_MIN_WPM, _MAX_WPM = 80, 500  # espeak-ng's own range for -s
_CJK_RE = re.compile("[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002ffff]")
_PROBE_TIMEOUT_S = 10.0
_NICE = 10  # espeak-ng yields the CPU to the server process (pacing, Opus) under load
_NO_AUDIO = np.zeros(0, dtype=np.float32)  # a step's "nothing yet" for a stream still synthesising


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
    """One espeak-ng process and its output; the process starts on :meth:`start` (or the first chunk)."""

    def __init__(self, args: list[str], text: str, *, sample_rate: int, chunk_samples: int, timeout_s: float):
        self._args = args
        self._text = text
        self._sample_rate = sample_rate
        self._chunk_samples = chunk_samples
        self._timeout_s = timeout_s
        self._deadline = float("inf")
        self._stdout: IO[bytes] | None = None
        self._stderr: IO[bytes] | None = None
        self._start_error: OSError | None = None
        self._pcm: np.ndarray | None = None
        self._pos = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._pidfd: int | None = None
        self._closed = False

    @property
    def started(self) -> bool:
        return self._proc is not None or self._pcm is not None or self._closed

    @property
    def running(self) -> bool:
        """Its process was started and has not exited yet."""
        return self._pcm is None and self._proc is not None and self._proc.poll() is None

    @property
    def deadline(self) -> float:
        return self._deadline

    @property
    def pidfd(self) -> int | None:
        """A descriptor that becomes readable when the process exits (None where the OS has none)."""
        return self._pidfd

    def ready(self) -> bool:
        """Whether :meth:`next_chunk` returns (or raises) at once, without waiting for the process."""
        return (
            self._pcm is not None
            or self._closed
            or (self._proc is not None and (self._proc.poll() is not None or time.monotonic() >= self._deadline))
        )

    def start(self) -> None:
        """Start the espeak-ng process (once)."""
        if self.started:
            return
        self._stdout = tempfile.TemporaryFile()
        self._stderr = tempfile.TemporaryFile()
        try:
            self._proc = subprocess.Popen(
                self._args, stdin=subprocess.PIPE, stdout=self._stdout, stderr=self._stderr
            )
        except OSError as exc:
            self._start_error = exc
            self.close()
            raise
        self._deadline = time.monotonic() + self._timeout_s
        with contextlib.suppress(OSError, AttributeError):
            os.setpriority(os.PRIO_PROCESS, self._proc.pid, _NICE)
        with contextlib.suppress(OSError, AttributeError):
            self._pidfd = os.pidfd_open(self._proc.pid)
        self._feed_stdin(self._proc, self._text)

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
        if proc is None or self._stdout is None:
            raise EspeakError("stream is closed")
        try:
            returncode = proc.wait(timeout=max(0.0, self._deadline - time.monotonic()))
        except subprocess.TimeoutExpired as exc:
            self.close()
            raise EspeakError(f"espeak-ng did not finish within {self._timeout_s:g} s") from exc
        if returncode != 0:
            message = ""
            if self._stderr is not None:
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
            self.start()
            if self._start_error is not None:
                raise EspeakError(f"cannot start espeak-ng: {self._start_error}")
            try:
                self._pcm = self._collect()
            finally:
                self._release_files()
        if self._pos >= self._pcm.size:
            return None
        chunk = self._pcm[self._pos : self._pos + self._chunk_samples]
        self._pos += chunk.size
        return chunk

    def _release_files(self) -> None:
        for file in (self._stdout, self._stderr):
            if file is not None:
                file.close()
        pidfd, self._pidfd = self._pidfd, None
        if pidfd is not None:
            os.close(pidfd)

    def close(self) -> None:
        self._closed = True
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        self._release_files()


class EspeakBackend(Backend):
    """Speech through the espeak-ng CLI (22050 Hz on standard builds; probed at construction)."""

    name = "espeak"
    # Every open stream joins every step: one that is not ready costs a poll, and a stream whose audio is
    # ready must never wait outside the batch while the top-ranked streams are still synthesising.
    max_batch_size = 1024
    # espeak-ng reads digits itself, in both voices; the Chinese normaliser's output would make it worse:
    # its cmn dictionary lacks many of the characters it writes (三, 零, 点, 千 are spelled in English).
    reads_raw_text = True

    def __init__(
        self,
        *,
        executable: str = "espeak-ng",
        rate_wpm: int = 175,
        voices: dict[str, str] | None = None,
        timeout_s: float = 10.0,
        chunk_ms: int = 200,
        max_processes: int | None = None,
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
        if max_processes is not None and max_processes < 1:
            raise ValueError(f"max_processes must be >= 1, got {max_processes}")
        voice_map = dict(DEFAULT_VOICES if voices is None else voices)
        if not voice_map:
            raise ValueError("voices must map at least one name to an espeak-ng voice")
        self.executable = path
        self.rate_wpm = rate_wpm
        self.timeout_s = timeout_s
        self.chunk_ms = chunk_ms
        self.max_processes = max_processes or os.cpu_count() or 1
        self._running: list[EspeakStream] = []  # streams whose espeak-ng process may still run
        self._wake_r, self._wake_w = os.pipe()  # wake(): ends a step's wait when the engine has a command
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
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

    def open_stream(self, text: str, voice: str, speed: float, instruct: str | None = None) -> EspeakStream:
        """``instruct`` is never passed (no ``supports_instruct``); the signature is the contract's."""
        return EspeakStream(
            self.command_for(text, voice, speed),
            text,
            sample_rate=self.sample_rate,
            chunk_samples=max(1, round(self.sample_rate * self.chunk_ms / 1000)),
            timeout_s=self.timeout_s,
        )

    def step(
        self, streams: list[BackendStream], budget: StepBudget = UNCAPPED
    ) -> list[np.ndarray | None | BaseException]:
        """One chunk for every stream whose audio is ready, an empty chunk for the others.

        ``streams`` come in the engine's order (least playback slack first), which is the order their
        processes start in. Blocks only when no stream of the batch is ready (see the module docstring).
        """
        mine = [s for s in streams if isinstance(s, EspeakStream)]
        while True:
            self._start_processes(mine)
            if any(s.ready() for s in mine) or len(mine) < len(streams) or not self._running:
                break
            if self._wait_any(self._running):
                break  # a new request or an abort: let the engine see it (its streams get no audio yet)
        results: list[np.ndarray | None | BaseException] = []
        for stream in streams:
            if isinstance(stream, EspeakStream) and not stream.ready():
                results.append(_NO_AUDIO)
                continue
            try:
                results.append(stream.next_chunk())
            except Exception as exc:  # noqa: BLE001 - one stream's failure must not stop the others
                results.append(exc)
        return results

    def _start_processes(self, ranked: list[EspeakStream]) -> None:
        self._running = [s for s in self._running if s.running]
        for stream in ranked:
            if len(self._running) >= self.max_processes:
                return
            if not stream.started:
                try:
                    stream.start()
                except OSError:
                    continue  # the stream is ready with its error: next_chunk() raises it
                self._running.append(stream)

    def _wait_any(self, streams: list[EspeakStream]) -> bool:
        """Block until one of the processes exits, the earliest deadline passes or :meth:`wake` is
        called; returns whether it was woken."""
        timeout_s = max(0.0, min(s.deadline for s in streams) - time.monotonic())
        fds = [s.pidfd for s in streams if s.pidfd is not None]
        if len(fds) < len(streams):  # no pidfd on this OS: wait for the oldest process
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc = streams[0]._proc
                if proc is not None:
                    proc.wait(timeout=timeout_s)
            return False
        poller = select.poll()
        for fd in (*fds, self._wake_r):
            poller.register(fd, select.POLLIN)
        events = poller.poll(timeout_s * 1000)
        woken = any(fd == self._wake_r for fd, _ in events)
        if woken:
            with contextlib.suppress(BlockingIOError):
                while os.read(self._wake_r, 4096):
                    pass
        return woken

    def wake(self) -> None:
        with contextlib.suppress(OSError):  # BlockingIOError: a wake-up is pending already
            os.write(self._wake_w, b"\0")

    def close(self) -> None:
        for stream in self._running:
            stream.close()
        self._running = []
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._wake_r = self._wake_w = -1  # a late wake() must never write into a reused descriptor

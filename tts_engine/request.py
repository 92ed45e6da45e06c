"""One synthesis request, seen from both sides of the thread boundary.

``EngineRequest`` is the engine thread's state for a request; only the engine thread reads or changes it
(after ``synthesize()`` hands it over through the inbox). ``SynthesisStream`` is the event loop's side:
an async iterator of int16 chunks that the engine feeds through ``loop.call_soon_threadsafe``.
``ChunkCredit`` is the one object both sides touch, and each of its two counters has a single writer.

A stream fed from elsewhere (an engine worker's, gateway/engine_client/link.py) uses the public feed:
``receive()`` for a chunk made there (counted as produced, refused past the buffer bound) and
``finish()`` for its end; the engine thread uses ``finish()`` too.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum
from types import TracebackType
from typing import Any

import numpy as np
import torch

from tts_engine.backends.base import BackendStream
from tts_engine.errors import EngineError
from tts_engine.interface import DEFAULT_PRIORITY, PRIORITIES, Priority
from tts_engine.resample import StreamingResampler
from tts_engine.voices import PromptAudio


class RequestStatus(IntEnum):
    WAITING = 0  # handed to the engine thread; its backend stream is not open yet
    RUNNING = 1  # its backend stream is open and producing chunks
    # Every status from here on means finished (see is_finished()).
    FINISHED_STOPPED = 2  # the backend completed the utterance and the tail was delivered
    FINISHED_ABORTED = 3  # abort(), aclose() or a cancelled consumer
    FINISHED_FAILED = 4  # the backend raised for this request
    FINISHED_CLOSED = 5  # the engine shut down first

    def is_finished(self) -> bool:
        return self >= RequestStatus.FINISHED_STOPPED


class ChunkCredit:
    """Backpressure across the thread boundary.

    ``num_produced``/``samples_produced`` are written only by the engine thread (chunks and samples
    handed to the loop), ``num_consumed``/``samples_consumed`` only by the event loop (what the consumer
    took). Their difference is what sits unread: the backpressure bound counts chunks, the scheduler's
    playback slack counts samples.

    ``ahead`` is the listener's playback credit as a value, written only by the event loop as one tuple
    ``(seconds, set_at)``: seconds of the same listener's audio that play before this request's first
    sample, as of ``time.monotonic()`` ``set_at``; the engine decays it at real time (``ahead_at()``).
    """

    __slots__ = ("num_produced", "num_consumed", "samples_produced", "samples_consumed", "ahead")

    def __init__(self, ahead: float = 0.0) -> None:
        self.num_produced = 0
        self.num_consumed = 0
        self.samples_produced = 0
        self.samples_consumed = 0
        self.ahead: tuple[float, float] = (_clean_seconds(ahead), time.monotonic())

    def set_ahead(self, seconds: float) -> None:
        self.ahead = (_clean_seconds(seconds), time.monotonic())

    def ahead_at(self, now: float) -> float:
        """The playback credit at ``now``: ``max(0, value - (now - set_at))``."""
        value, set_at = self.ahead
        return max(0.0, value - max(0.0, now - set_at))

    def get_num_buffered(self) -> int:
        return self.num_produced - self.num_consumed


@dataclass(eq=False, slots=True, kw_only=True)
class EngineRequest:
    """The engine thread's state for one request."""

    req_id: str
    text: str
    voice: str
    speed: float
    output_rate: int  # the rate the consumer asked for; chunks are resampled to it
    stream: SynthesisStream  # the loop side; only ever called through loop.call_soon_threadsafe
    credit: ChunkCredit
    instruct: str | None = None  # style instruction (backends with supports_instruct only)
    prompt_audio: PromptAudio | None = None  # one-off zero-shot prompt recording (synthesize_zero_shot)
    prompt_text: str = ""  # transcript of prompt_audio
    priority: Priority = DEFAULT_PRIORITY  # its class: device, interactive or batch (tts_engine/interface.py)
    status: RequestStatus = RequestStatus.WAITING
    arrival_time: float = field(default_factory=time.monotonic)
    arrival_step: int = 0  # the scheduler's step count when it arrived
    first_chunk_step: int | None = None  # ... when its first chunk was handed out (None: not yet)
    backend_stream: BackendStream | None = None
    resampler: StreamingResampler | None = None
    num_chunks: int = 0  # chunks handed to the loop
    parked: bool = False  # a batch request parked by the scheduler: holds no capacity, does not run

    @property
    def rank(self) -> int:
        """Its class as a number, 0 the highest (``PRIORITIES``' order)."""
        return PRIORITIES.index(self.priority)

    @property
    def is_batch(self) -> bool:
        return self.priority == "batch"

    def to_pcm(self, chunk: Any) -> np.ndarray:
        """One backend chunk as int16 at the requested rate (empty while the resampler fills up)."""
        if self.resampler is None:
            raise EngineError(f"request {self.req_id} has no open stream")
        return _to_int16(self.resampler.process(as_float_tensor(chunk)))

    def flush_pcm(self) -> np.ndarray:
        """The resampler's tail as int16, once the backend has finished the utterance."""
        if self.resampler is None:
            raise EngineError(f"request {self.req_id} has no open stream")
        return _to_int16(self.resampler.flush())


class SynthesisStream:
    """Async iterator of int16 mono ``np.ndarray`` chunks at ``sample_rate`` (its request's output rate),
    from ``TTSEngine.synthesize()``: the ``SpeechStream`` of tts_engine/interface.py.

    Read it with ``async for``. ``aclose()`` (or leaving ``async with``) aborts the request in the engine;
    so does cancelling the task while it waits for the next chunk. A backend failure raises
    ``SynthesisFailed`` after the chunks produced before it; ``engine.close()`` raises ``EngineClosed``.
    An aborted stream ends quietly. Use it on the event loop the engine was started on, one reader at a time.
    """

    def __init__(
        self,
        req_id: str,
        sample_rate: int,
        *,
        credit: ChunkCredit,
        max_buffered_chunks: int,
        on_resume: Callable[[], None],
        on_abort: Callable[[str], None],
        on_done: Callable[[SynthesisStream], None],
    ) -> None:
        self.req_id = req_id
        self.sample_rate = sample_rate
        self._credit = credit
        self._max_buffered_chunks = max_buffered_chunks
        self._on_resume = on_resume
        self._on_abort = on_abort
        self._on_done: list[Callable[[SynthesisStream], None]] = [on_done]
        self._chunks: deque[np.ndarray] = deque()
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self.is_finished = False
        """No more chunks will arrive (the buffered ones can still be read)."""
        self.is_aborted = False
        self._defer_credit = False
        self.first_chunk_at: float | None = None
        """When its first chunk reached this stream (``time.monotonic()``), read or not; None before."""

    @property
    def playback_ahead(self) -> float:
        """The listener's audio that plays before this stream's first sample, decayed to now (seconds)."""
        return self._credit.ahead_at(time.monotonic())

    def set_playback_ahead(self, seconds: float) -> None:
        """Update the playback credit: ``seconds`` of the listener's audio play before this stream's first
        sample, as of now (the engine decays it at real time). A bad value counts as nothing ahead."""
        self._credit.set_ahead(seconds)

    def defer_credit(self) -> None:
        """Reads stop counting as consumed: ``credit_consumed()`` reports consumption instead (an engine
        worker forwards chunks at once and counts them consumed when its remote reader has taken them)."""
        self._defer_credit = True

    def credit_consumed(self, chunks: int, samples: int) -> None:
        """``chunks`` (``samples`` in all) were consumed downstream (after ``defer_credit()``)."""
        credit = self._credit
        was_full = credit.get_num_buffered() >= self._max_buffered_chunks
        credit.num_consumed += chunks
        credit.samples_consumed += samples
        if was_full and not self.is_finished and credit.get_num_buffered() < self._max_buffered_chunks:
            self._on_resume()

    @property
    def max_buffered_chunks(self) -> int:
        """Unread chunks this stream may hold; the engine makes no more until its reader takes one."""
        return self._max_buffered_chunks

    @property
    def error(self) -> BaseException | None:
        """Why it ended, once it ended with an error (until a reader has raised it)."""
        return self._error

    @property
    def num_buffered(self) -> int:
        """Chunks received from the engine and not read yet."""
        return len(self._chunks)

    @property
    def unread_seconds(self) -> float:
        """Audio produced for this stream and not read yet, in seconds (safe to read from any thread)."""
        credit = self._credit
        return max(0, credit.samples_produced - credit.samples_consumed) / self.sample_rate

    # -- fed by the engine (or a worker link), on the event loop -----------------------------------

    def _push_chunk(self, chunk: np.ndarray) -> None:
        """A chunk the engine thread made (and counted as produced)."""
        if self.is_finished:
            return  # aborted or closed meanwhile: its chunks are never delivered
        if self.first_chunk_at is None:
            self.first_chunk_at = time.monotonic()
        self._chunks.append(chunk)
        self._wake()

    def receive(self, chunk: np.ndarray) -> bool:
        """A chunk made elsewhere (an engine worker): counted as produced here and buffered; False, and
        nothing buffered, when it breaks the buffer bound (the sender ignored the credit)."""
        credit = self._credit
        credit.num_produced += 1
        credit.samples_produced += chunk.size
        if len(self._chunks) >= self._max_buffered_chunks:
            return False
        self._push_chunk(chunk)
        return True

    def finish(self, error: BaseException | None = None) -> None:
        """No more chunks: the reader gets the buffered ones, then ``error`` (or the end). Idempotent."""
        if self.is_finished:
            return
        self.is_finished = True
        self._error = error
        self._wake()
        self._done()

    # -- consumer API ------------------------------------------------------------------------------

    def __aiter__(self) -> SynthesisStream:
        return self

    async def __anext__(self) -> np.ndarray:
        while not self._chunks:
            if self.is_finished:
                error, self._error = self._error, None
                if error is not None:
                    raise error
                raise StopAsyncIteration
            if self._waiter is not None:
                raise RuntimeError(f"another task is already reading stream {self.req_id}")
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            except asyncio.CancelledError:
                self.abort()
                raise
            finally:
                self._waiter = None
        chunk = self._chunks.popleft()
        if self._defer_credit:
            return chunk
        credit = self._credit
        credit.num_consumed += 1
        credit.samples_consumed += chunk.size
        if not self.is_finished and credit.get_num_buffered() == self._max_buffered_chunks - 1:
            self._on_resume()  # the engine may have parked this request at the bound: wake it
        return chunk

    async def aclose(self) -> None:
        """Abort the request in the engine and drop buffered chunks. Idempotent."""
        self.abort()

    async def __aenter__(self) -> SynthesisStream:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    def abort(self) -> bool:
        """End the stream now and tell the engine; False when it had already ended (the synchronous
        ``aclose()``)."""
        self._chunks.clear()
        if self.is_finished:
            return False
        self.is_finished = True
        self.is_aborted = True
        self._wake()
        self._on_abort(self.req_id)
        self._done()
        return True

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def add_done_callback(self, callback: Callable[[SynthesisStream], None]) -> None:
        """Call ``callback(stream)`` once it has ended (finished, failed or aborted); at once if it has."""
        if self.is_finished:
            callback(self)
        else:
            self._on_done.append(callback)

    def _done(self) -> None:
        callbacks, self._on_done = self._on_done, []
        for callback in callbacks:
            callback(self)

    def __repr__(self) -> str:
        state = "aborted" if self.is_aborted else "finished" if self.is_finished else "open"
        return f"<SynthesisStream {self.req_id} {self.sample_rate} Hz {state}, {len(self._chunks)} buffered>"


def _clean_seconds(seconds: object) -> float:
    """A playback credit in seconds; anything but a finite positive number counts as 0."""
    try:
        value = float(seconds)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return 0.0
    return value if value > 0 and math.isfinite(value) else 0.0


def as_float_tensor(chunk: Any) -> torch.Tensor:
    """A backend chunk (1-D float ``np.ndarray``, or a torch tensor) as a float32 tensor."""
    if isinstance(chunk, np.ndarray):
        if not np.issubdtype(chunk.dtype, np.floating):
            raise EngineError(f"backend chunk must be float PCM, got {chunk.dtype}")
        tensor = torch.from_numpy(np.require(chunk, np.float32, ["C", "W"]))
    elif isinstance(chunk, torch.Tensor) and chunk.is_floating_point():
        tensor = chunk.to(torch.float32)
    else:
        raise EngineError(f"backend chunk must be a float np.ndarray, got {type(chunk).__name__}")
    if tensor.ndim != 1:
        raise EngineError(f"backend chunk must be 1-D, got shape {tuple(tensor.shape)}")
    return tensor


def _to_int16(audio: torch.Tensor) -> np.ndarray:
    """Float PCM in [-1, 1] to int16: scale, round, clip (NaN becomes silence, infinities full scale)."""
    samples = audio.detach().to("cpu", torch.float32).numpy()
    samples = np.nan_to_num(samples, nan=0.0, posinf=1.0, neginf=-1.0)
    return np.clip(np.rint(samples * 32767.0), -32768, 32767).astype(np.int16)

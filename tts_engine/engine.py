"""The TTS engine: one thread that owns the backend, fed by an inbox, feeding the event loop.

    event loop                         engine thread (owns every backend call)
    ──────────                         ──────────────────────────────────────
    synthesize() ── _NewRequests ─┐
    abort()/aclose() ── _Abort ───┼──> inbox (queue.Queue) ──> step(): schedule -> backend.step
    chunk consumed ── _RESUME ────┘                                    -> drain inbox -> update
    SynthesisStream <── loop.call_soon_threadsafe(chunk / end) <─────────────┘

The policy (admission against the backend's declared limits, the bounded wait, ranking by playback
slack, the batch cap, each step's row budget) is the ``Scheduler``'s (tts_engine/scheduler.py); the
thread's loop, step and delivery are the ``EngineLoop``'s (tts_engine/engine_loop.py), which
``TTSEngine`` holds; this module is the event-loop API. The thread blocks on the inbox whenever nothing is runnable (with a timeout only while a
request waits for capacity, to fail it at ``max_queue_wait_s``): no polling. A request is runnable while
its consumer holds fewer than ``max_buffered_chunks`` unread chunks (backpressure); the consumer wakes
the thread when it takes a chunk at that bound. Requests submitted in one event-loop tick reach the
thread as one command (``_NewRequests``), so a burst (many streams starting at once) is admitted and
prefilled in one step: were they put one by one, the thread could wake on the first and run a step
for it alone, putting the others a step behind and making everyone's first hop wait for that lone
one's. Aborts that arrive during a step are applied before
its output is handed out, so an aborted request's chunks are never delivered. A step's audio is
resampled and converted to int16 in batches on the backend's device (tts_engine/postprocess.py).

Text: every request's text (device turns and the API alike enter here) goes through
``text_normalizer`` (``tts.text_normalization``: numbers, dates, units... as words; built once at
start-up) in the engine thread just before the backend opens the stream, unless the backend
``reads_raw_text`` (espeak). wetext costs about 2 ms a sentence with numbers: on the event loop a
burst of turns would stall every device's pacing in one block; here it interleaves with it.

Voices: ``add_voice()``/``remove_voice()`` (and the voice preparation of ``synthesize_zero_shot()``)
run their backend call in the engine thread too, through the inbox as a ``_Call``, so they never race
a step; ``voices``/``default_voice`` are refreshed from the backend after each such call.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from tts_engine.arguments import (
    MAX_SPEED,
    MIN_SPEED,
    check_arguments,
    check_instruct,
    check_priority,
    check_req_id,
    check_text_length,
    check_zero_shot,
)
from tts_engine.backends.base import Backend
from tts_engine.engine_loop import CallOutcome, EngineLoop
from tts_engine.engine_properties import EngineProperties
from tts_engine.errors import EngineClosed, EngineError, EngineOverloaded
from tts_engine.interface import DEFAULT_PRIORITY, OUTPUT_RATES, EngineInfo, Priority
from tts_engine.request import ChunkCredit, EngineRequest, SynthesisStream
from tts_engine.voices import PromptAudio, VoicePreset, decode_prompt_wav

__all__ = ["MAX_SPEED", "MIN_SPEED", "OUTPUT_RATES", "TTSEngine"]

logger = logging.getLogger(__name__)


class TTSEngine(EngineProperties):
    """Shared speech engine in this process: the ``SpeechEngine`` of tts_engine/interface.py.
    ``synthesize()`` returns a ``SynthesisStream`` of int16 chunks."""

    def __init__(
        self,
        backend: Backend,
        *,
        max_pending_requests: int = 256,
        max_buffered_chunks: int = 8,
        max_queue_wait_s: float | None = 30.0,
        text_normalizer: Callable[[str], str] | None = None,
    ):
        """``text_normalizer`` rewrites each request's text before the backend gets it (None: as is)."""
        if max_pending_requests < 1:
            raise ValueError(f"max_pending_requests must be >= 1, got {max_pending_requests}")
        if max_buffered_chunks < 1:
            raise ValueError(f"max_buffered_chunks must be >= 1, got {max_buffered_chunks}")
        self._backend = backend
        self.max_pending_requests = max_pending_requests
        self.max_buffered_chunks = max_buffered_chunks
        self._voices = list(backend.voices())
        self._default_voice = backend.default_voice
        self._max_text_chars = backend.max_text_chars  # read once, like the backend's limits
        self._engine = EngineLoop(
            backend,
            max_buffered_chunks=max_buffered_chunks,
            max_queue_wait_s=max_queue_wait_s,
            text_normalizer=text_normalizer,
            on_call_done=self._finish_call,
            on_stopped=self._on_thread_stopped,
        )
        self._scheduler = self._engine.scheduler  # read here for stats; written by the engine thread only
        self.max_queue_wait_s = max_queue_wait_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopped: asyncio.Future[None] | None = None
        self._is_closed = False
        self._streams: dict[str, SynthesisStream] = {}  # open streams by req_id
        self._num_requests_total = 0
        self._num_requests_rejected = 0
        self._num_submitted = 0  # requests put in the inbox
        self._calls: set[asyncio.Future[Any]] = set()  # call futures not resolved yet
        self._unsent: list[EngineRequest] = []  # submitted this loop tick; sent together at its end

    # -- properties (the rest: EngineProperties, tts_engine/engine_properties.py) -------------------

    @property
    def info(self) -> EngineInfo:
        """What this engine is and takes (its backend's, and its own limits as they are now)."""
        return EngineInfo(
            backend=self._backend.name,
            sample_rate=self._backend.sample_rate,
            supports_cloning=self._backend.supports_cloning,
            text_normalization=self.text_normalization,
            max_text_chars=self._max_text_chars,
            max_buffered_chunks=self.max_buffered_chunks,
            max_pending_requests=self.max_pending_requests,
        )

    @property
    def text_normalization(self) -> str:
        """The normaliser's mode (wetext, basic, off), "off" when none applies to this backend."""
        normalize = self._engine.normalize_text
        if normalize is None:
            return "off"
        return str(getattr(normalize, "mode", "custom"))

    @property
    def is_running(self) -> bool:
        return self._engine.is_started and not self._is_closed

    @property
    def stats(self) -> dict[str, int | float]:
        """Counters for metrics; a fresh snapshot on each access."""
        return {
            "requests_total": self._num_requests_total,
            "requests_rejected": self._num_requests_rejected,
            **self._engine.counts,
            "busy_seconds_total": self._engine.busy_seconds,
            **self._scheduler.stats,
            **self._backend.memory_stats(),
            **self._backend.step_stats(),
            "queue_depth": max(0, self._num_submitted - self._engine.num_received) + len(self._scheduler.waiting),
            "live": len(self._scheduler.requests),
        }

    def health(self) -> dict[str, Any]:
        stats = self.stats
        return {
            **self.info.as_dict(),
            "voices": self.voices,
            "default_voice": self.default_voice,
            "state": self._state(),
            "live_requests": stats["live"],
            "open_streams": len(self._streams),
            "queue_depth": stats["queue_depth"],
            "requests_total": stats["requests_total"],
            "errors": stats["requests_failed"],
            "batching": {
                "max_batch_size": self._scheduler.max_batch_size,
                "capacity": self._scheduler.capacity,
                "running": stats["running"],
                "waiting": stats["waiting"],
                "last_batch_size": stats["last_batch_size"],
                "mean_batch_size": stats["mean_batch_size"],
                "max_queue_wait_s": self.max_queue_wait_s,
            },
            "memory": self._backend.memory_stats(),
            "step_running_s": self._engine.step_running_s(),
            "stats": stats,
        }

    def _state(self) -> str:
        if self._engine.crash is not None:
            return "crashed"
        if self._is_closed:
            return "closed"
        return "running" if self._engine.is_started else "new"

    # -- lifecycle -----------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the engine thread, bound to the running event loop."""
        if self._is_closed:
            raise EngineClosed("engine is closed")
        if self._engine.is_started:
            raise EngineError("engine already started")
        self._loop = asyncio.get_running_loop()
        self._stopped = self._loop.create_future()
        self._engine.start(self._loop)

    async def close(self) -> None:
        """Stop the thread after its current step, close the backend, fail open streams (EngineClosed)."""
        if not self._is_closed:
            self._is_closed = True
            self._unsent.clear()  # never seen by the thread: failed below with the other open streams
            if not self._engine.is_started:
                self._backend.close()
            else:
                self._engine.shutdown()
        if self._stopped is not None:
            await asyncio.shield(self._stopped)
        if self._engine.is_started:
            # The thread has posted its last callback and is returning: join it, so no daemon thread is
            # still inside torch / onnxruntime when the interpreter tears down their native state (seen
            # as a rare "terminate called without an active exception" abort at process exit).
            self._engine.join(timeout=10.0)
        self._fail_open_streams("engine closed")

    # -- requests ------------------------------------------------------------------------------------

    def synthesize(
        self,
        text: str,
        *,
        voice: str | None = None,
        output_rate: int = 16000,
        req_id: str | None = None,
        speed: float = 1.0,
        instruct: str | None = None,
        playback_ahead: float = 0.0,
        priority: Priority = DEFAULT_PRIORITY,
    ) -> SynthesisStream:
        """Queue ``text``; returns at once, its stream resampled to ``output_rate`` (one of
        ``OUTPUT_RATES``). Call on the engine's event loop.

        ``priority``: ``"device"`` (a device's live turn), ``"interactive"`` (the default: a client
        waiting on the stream) or ``"batch"`` (nobody listens live: it runs in the capacity the others
        leave free, yields to their first audio and may be parked; its queue wait is not bounded by
        ``max_queue_wait_s``, its caller owns that deadline). ValueError for anything else.

        ``instruct`` is a style instruction (CosyVoice instruct mode); backends without
        ``supports_instruct`` (fake, espeak) ignore it. ``playback_ahead`` is how many seconds of the
        same listener's audio play before this text's first sample, as of now (say, the rest of the
        previous sentence); ``SynthesisStream.set_playback_ahead()`` updates it. The engine decays it at
        real time and counts it as slack, so a session's look-ahead sentence does not jump ahead of
        another listener's first chunk. A value that is not a finite positive number counts as 0.
        """
        self._check_open()
        check_arguments(text, output_rate, speed)
        check_text_length(text, self._max_text_chars)
        return self._submit(
            text, self.resolve_voice(voice), output_rate, req_id, speed, check_instruct(instruct),
            playback_ahead=playback_ahead, priority=check_priority(priority),
        )  # fmt: skip

    def synthesize_zero_shot(
        self,
        text: str,
        *,
        prompt_wav: bytes,
        prompt_text: str,
        output_rate: int = 16000,
        speed: float = 1.0,
        req_id: str | None = None,
        instruct: str | None = None,
        priority: Priority = DEFAULT_PRIORITY,
    ) -> SynthesisStream:
        """Like ``synthesize()`` in a voice cloned from ``prompt_wav`` (WAV bytes) and its transcript.

        The recording is checked here (VoiceError) and its features are prepared in the engine thread
        when the request starts; nothing is cached. Raises VoiceError when the backend cannot clone.
        """
        self._check_open()
        check_arguments(text, output_rate, speed)
        check_text_length(text, self._max_text_chars)
        prompt_text = check_zero_shot(self.backend_name, self._backend.supports_cloning, prompt_text)
        priority = check_priority(priority)
        audio = decode_prompt_wav(prompt_wav)
        return self._submit(
            text, "", output_rate, req_id, speed, check_instruct(instruct), audio, prompt_text, priority=priority
        )

    def _check_open(self) -> asyncio.AbstractEventLoop:
        if self._is_closed:
            raise EngineClosed("engine is closed")
        if self._loop is None:
            raise EngineError("engine not started; await engine.start() first")
        return self._loop

    def _submit(
        self,
        text: str,
        voice: str,
        output_rate: int,
        req_id: str | None,
        speed: float,
        instruct: str | None,
        prompt_audio: PromptAudio | None = None,
        prompt_text: str = "",
        *,
        playback_ahead: float = 0.0,
        priority: Priority = DEFAULT_PRIORITY,
    ) -> SynthesisStream:
        req_id = check_req_id(req_id, self._streams)
        if len(self._streams) >= self.max_pending_requests:
            self._num_requests_rejected += 1
            raise EngineOverloaded(f"too many pending requests (limit {self.max_pending_requests})")

        self._num_requests_total += 1
        credit = ChunkCredit(playback_ahead)
        stream = SynthesisStream(
            req_id,
            output_rate,
            credit=credit,
            max_buffered_chunks=self.max_buffered_chunks,
            on_resume=self._resume,
            on_abort=self._send_abort,
            on_done=self._forget_stream,
        )
        if not text.strip():
            stream.finish()  # nothing to say: an empty stream, the engine never sees it
            return stream
        request = EngineRequest(
            req_id=req_id, text=text, voice=voice, speed=float(speed), output_rate=output_rate,
            stream=stream, credit=credit, instruct=instruct, prompt_audio=prompt_audio, prompt_text=prompt_text,
            priority=priority,
        )  # fmt: skip
        self._streams[req_id] = stream
        self._num_submitted += 1
        if not self._unsent:
            self._check_open().call_soon(self._send_unsent)
        self._unsent.append(request)
        return stream

    def _send_unsent(self) -> None:
        """Hand this tick's new requests to the thread as one command (before any later command)."""
        if self._unsent:
            requests, self._unsent = self._unsent, []
            self._engine.submit_many(requests)

    # -- voices --------------------------------------------------------------------------------------

    async def add_voice(self, preset: VoicePreset) -> None:
        """Prepare ``preset`` in the engine thread and offer it by name (VoiceError when it cannot clone)."""
        self._check_cloning()
        await self._call(lambda: self._backend.add_voice(preset))

    async def remove_voice(self, name: str) -> None:
        """Stop offering a voice added with ``add_voice()``; requests already running keep it."""
        self._check_cloning()
        await self._call(lambda: self._backend.remove_voice(name))

    async def _call(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` in the engine thread between two steps and return its result (or raise its error)."""
        future: asyncio.Future[Any] = self._check_open().create_future()
        self._calls.add(future)
        self._send_unsent()  # keep the order the caller made its calls in
        self._engine.call(fn, future)
        return await asyncio.shield(future)  # a cancelled caller leaves the call to finish in the thread

    def _finish_call(self, outcome: CallOutcome) -> None:
        future, result, error, voices = outcome
        self._calls.discard(future)
        if voices is not None:
            self._voices, self._default_voice = voices
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    # -- event-loop helpers --------------------------------------------------------------------------

    def _resume(self) -> None:
        self._engine.resume()

    def _send_abort(self, req_id: str) -> None:
        self._send_unsent()  # the request must reach the thread before its abort
        self._engine.abort(req_id)

    def _forget_stream(self, stream: SynthesisStream) -> None:
        if self._streams.get(stream.req_id) is stream:
            del self._streams[stream.req_id]

    def _fail_open_streams(self, reason: str, cause: BaseException | None = None) -> None:
        for stream in list(self._streams.values()):
            error = EngineClosed(reason)
            error.__cause__ = cause
            stream.finish(error)
        for future in list(self._calls):
            if not future.done():
                future.set_exception(EngineClosed(reason))
        self._calls.clear()

    def _on_thread_stopped(self, crash: BaseException | None) -> None:
        self._is_closed = True
        self._fail_open_streams(f"engine thread crashed: {crash!r}" if crash else "engine closed", crash)
        if self._stopped is not None and not self._stopped.done():
            self._stopped.set_result(None)

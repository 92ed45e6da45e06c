"""The TTS engine: one thread that owns the backend, fed by an inbox, feeding the event loop.

    event loop                         engine thread (owns every backend call)
    ──────────                         ──────────────────────────────────────
    synthesize() ── _NewRequest ──┐
    abort()/aclose() ── _Abort ───┼──> inbox (queue.Queue) ──> step(): schedule -> backend.step
    chunk consumed ── _RESUME ────┘                                    -> drain inbox -> update
    SynthesisStream <── loop.call_soon_threadsafe(chunk / end) <─────────────┘

The thread blocks on the inbox whenever nothing is runnable: no polling. A request is runnable while
its consumer holds fewer than ``max_buffered_chunks`` unread chunks (backpressure); the consumer wakes
the thread when it takes a chunk at that bound. Aborts that arrive during a step are applied before
its output is handed out, so an aborted request's chunks are never delivered.

Voices: ``add_voice()``/``remove_voice()`` (and the voice preparation of ``synthesize_zero_shot()``)
run their backend call in the engine thread too, through the inbox as a ``_Call``, so they never race
a step; ``voices``/``default_voice`` are refreshed from the backend after each such call.

The scheduler here is deliberately simple (every runnable stream, least buffered first, up to the
backend's ``max_batch_size``); a batching scheduler replaces ``_schedule()``/``_update_from_output()``.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from tts_engine.backends.base import Backend
from tts_engine.errors import EngineClosed, EngineError, EngineOverloaded, SynthesisFailed, UnknownVoice
from tts_engine.request import ChunkCredit, EngineRequest, RequestStatus, SynthesisStream
from tts_engine.resample import StreamingResampler
from tts_engine.voices import PromptAudio, VoiceError, VoicePreset, decode_prompt_wav

logger = logging.getLogger(__name__)

SUPPORTED_SAMPLE_RATES = (8000, 12000, 16000, 22050, 24000, 44100, 48000)
MIN_SPEED, MAX_SPEED = 0.25, 4.0


@dataclass(frozen=True, slots=True)
class _NewRequest:
    request: EngineRequest


@dataclass(frozen=True, slots=True)
class _Abort:
    req_id: str


@dataclass(frozen=True, slots=True)
class _Call:
    """Run ``fn`` in the engine thread between steps; its outcome goes to ``future`` on the loop."""

    fn: Callable[[], Any]
    future: asyncio.Future[Any]


class _Resume:
    """A consumer made room under the buffer bound; the command itself carries nothing."""


class _Shutdown:
    pass


_RESUME = _Resume()
_SHUTDOWN = _Shutdown()
_Command = _NewRequest | _Abort | _Call | _Resume | _Shutdown
MAX_INSTRUCT_CHARS = 500


class _LoopGone(Exception):
    """The event loop the engine was started on is closed; nobody can receive output any more."""


class TTSEngine:
    """Shared speech engine: ``synthesize()`` returns a ``SynthesisStream`` of int16 chunks."""

    def __init__(self, backend: Backend, *, max_pending_requests: int = 256, max_buffered_chunks: int = 8):
        if max_pending_requests < 1:
            raise ValueError(f"max_pending_requests must be >= 1, got {max_pending_requests}")
        if max_buffered_chunks < 1:
            raise ValueError(f"max_buffered_chunks must be >= 1, got {max_buffered_chunks}")
        self._backend = backend
        self.max_pending_requests = max_pending_requests
        self.max_buffered_chunks = max_buffered_chunks
        self._voices = list(backend.voices())
        self._default_voice = backend.default_voice
        self._inbox: queue.Queue[_Command] = queue.Queue()
        # Event-loop side.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopped: asyncio.Future[None] | None = None
        self._is_closed = False
        self._streams: dict[str, SynthesisStream] = {}  # open streams by req_id
        self._num_requests_total = 0
        self._num_requests_rejected = 0
        self._num_submitted = 0  # requests put in the inbox
        self._calls: set[asyncio.Future[Any]] = set()  # _Call futures not resolved yet
        # Engine-thread side: only the engine thread writes these.
        self._requests: dict[str, EngineRequest] = {}  # every unfinished request by req_id
        self._waiting: list[EngineRequest] = []
        self._running: list[EngineRequest] = []
        self._num_received = 0  # _NewRequest commands taken from the inbox
        self._counts = dict.fromkeys(
            ("requests_finished", "requests_failed", "requests_aborted", "chunks_total", "samples_total",
             "steps_total", "step_streams_total"),
            0,
        )  # fmt: skip
        self._is_shutting_down = False
        self._crash: BaseException | None = None

    # -- properties ----------------------------------------------------------------------------------

    @property
    def backend_name(self) -> str:
        return self._backend.name

    @property
    def sample_rate(self) -> int:
        """The backend's native rate (streams are resampled to the rate each request asks for)."""
        return self._backend.sample_rate

    @property
    def voices(self) -> list[str]:
        return list(self._voices)

    @property
    def default_voice(self) -> str:
        return self._default_voice

    @property
    def supports_cloning(self) -> bool:
        """``add_voice()`` and ``synthesize_zero_shot()`` work with this backend."""
        return self._backend.supports_cloning

    @property
    def is_running(self) -> bool:
        return self._thread is not None and not self._is_closed

    @property
    def stats(self) -> dict[str, int]:
        """Counters for metrics; a fresh snapshot on each access."""
        return {
            "requests_total": self._num_requests_total,
            "requests_rejected": self._num_requests_rejected,
            **self._counts,
            "queue_depth": max(0, self._num_submitted - self._num_received) + len(self._waiting),
            "live": len(self._requests),
        }

    def health(self) -> dict[str, Any]:
        stats = self.stats
        return {
            "backend": self.backend_name,
            "sample_rate": self.sample_rate,
            "voices": self.voices,
            "default_voice": self.default_voice,
            "supports_cloning": self.supports_cloning,
            "state": self._state(),
            "live_requests": stats["live"],
            "open_streams": len(self._streams),
            "queue_depth": stats["queue_depth"],
            "requests_total": stats["requests_total"],
            "errors": stats["requests_failed"],
            "stats": stats,
        }

    def _state(self) -> str:
        if self._crash is not None:
            return "crashed"
        if self._is_closed:
            return "closed"
        return "running" if self._thread is not None else "new"

    # -- lifecycle -----------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the engine thread, bound to the running event loop."""
        if self._is_closed:
            raise EngineClosed("engine is closed")
        if self._thread is not None:
            raise EngineError("engine already started")
        self._loop = asyncio.get_running_loop()
        self._stopped = self._loop.create_future()
        self._thread = threading.Thread(target=self._run, name=f"tts-engine-{self.backend_name}", daemon=True)
        self._thread.start()

    async def close(self) -> None:
        """Stop the thread after its current step, close the backend, fail open streams (EngineClosed)."""
        if not self._is_closed:
            self._is_closed = True
            if self._thread is None:
                self._backend.close()
            else:
                self._inbox.put(_SHUTDOWN)
        if self._stopped is not None:
            await asyncio.shield(self._stopped)
        self._fail_open_streams("engine closed")

    # -- requests ------------------------------------------------------------------------------------

    def synthesize(
        self,
        text: str,
        *,
        voice: str | None = None,
        sample_rate: int = 16000,
        req_id: str | None = None,
        speed: float = 1.0,
        instruct: str | None = None,
    ) -> SynthesisStream:
        """Queue ``text``; returns at once. Call on the engine's event loop.

        ``instruct`` is a style instruction (CosyVoice instruct mode); backends without
        ``supports_instruct`` (fake, espeak) ignore it.
        """
        self._check_open()
        _check_arguments(text, sample_rate, speed)
        voice = self._default_voice if voice is None else voice
        if voice not in self._voices:
            raise UnknownVoice(voice, self._voices)
        return self._submit(text, voice, sample_rate, req_id, speed, _check_instruct(instruct))

    def synthesize_zero_shot(
        self,
        text: str,
        *,
        prompt_wav: bytes,
        prompt_text: str,
        sample_rate: int = 16000,
        speed: float = 1.0,
        req_id: str | None = None,
        instruct: str | None = None,
    ) -> SynthesisStream:
        """Like ``synthesize()`` in a voice cloned from ``prompt_wav`` (WAV bytes) and its transcript.

        The recording is checked here (VoiceError) and its features are prepared in the engine thread
        when the request starts; nothing is cached. Raises VoiceError when the backend cannot clone.
        """
        self._check_open()
        _check_arguments(text, sample_rate, speed)
        if not self._backend.supports_cloning:
            raise VoiceError(f"backend {self.backend_name} cannot clone voices")
        if not isinstance(prompt_text, str):
            raise VoiceError(f"prompt_text must be a string, got {type(prompt_text).__name__}")
        audio = decode_prompt_wav(prompt_wav)
        return self._submit(
            text, "", sample_rate, req_id, speed, _check_instruct(instruct), audio, prompt_text.strip()
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
        sample_rate: int,
        req_id: str | None,
        speed: float,
        instruct: str | None,
        prompt_audio: PromptAudio | None = None,
        prompt_text: str = "",
    ) -> SynthesisStream:
        if req_id is None:
            req_id = uuid.uuid4().hex
        elif not isinstance(req_id, str) or not req_id:
            raise ValueError(f"req_id must be a non-empty string, got {req_id!r}")
        elif req_id in self._streams:
            raise ValueError(f"req_id {req_id!r} is already in use by an open stream")
        if len(self._streams) >= self.max_pending_requests:
            self._num_requests_rejected += 1
            raise EngineOverloaded(f"too many pending requests (limit {self.max_pending_requests})")

        self._num_requests_total += 1
        credit = ChunkCredit()
        stream = SynthesisStream(
            req_id,
            sample_rate,
            credit=credit,
            max_buffered_chunks=self.max_buffered_chunks,
            on_resume=self._resume,
            on_abort=self._send_abort,
            on_done=self._forget_stream,
        )
        if not text.strip():
            stream._push_end()  # nothing to say: an empty stream, the engine never sees it
            return stream
        request = EngineRequest(
            req_id=req_id, text=text, voice=voice, speed=float(speed), sample_rate=sample_rate,
            stream=stream, credit=credit, instruct=instruct, prompt_audio=prompt_audio, prompt_text=prompt_text,
        )  # fmt: skip
        self._streams[req_id] = stream
        self._num_submitted += 1
        self._inbox.put(_NewRequest(request))
        return stream

    # -- voices --------------------------------------------------------------------------------------

    async def add_voice(self, preset: VoicePreset) -> None:
        """Prepare ``preset`` in the engine thread and offer it by name (VoiceError when it cannot clone)."""
        if not self._backend.supports_cloning:
            raise VoiceError(f"backend {self.backend_name} cannot clone voices")
        await self._call(lambda: self._backend.add_voice(preset))

    async def remove_voice(self, name: str) -> None:
        """Stop offering a voice added with ``add_voice()``; requests already running keep it."""
        if not self._backend.supports_cloning:
            raise VoiceError(f"backend {self.backend_name} cannot clone voices")
        await self._call(lambda: self._backend.remove_voice(name))

    async def _call(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` in the engine thread between two steps and return its result (or raise its error)."""
        future: asyncio.Future[Any] = self._check_open().create_future()
        self._calls.add(future)
        self._inbox.put(_Call(fn, future))
        return await asyncio.shield(future)  # a cancelled caller leaves the call to finish in the thread

    def _finish_call(self, outcome: tuple[asyncio.Future[Any], Any, BaseException | None, Any]) -> None:
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

    def abort(self, req_id: str) -> bool:
        """Abort an open request; its stream ends quietly. False when no open stream has this id."""
        stream = self._streams.get(req_id)
        return stream is not None and stream._abort()

    # -- event-loop helpers --------------------------------------------------------------------------

    def _resume(self) -> None:
        self._inbox.put(_RESUME)

    def _send_abort(self, req_id: str) -> None:
        self._inbox.put(_Abort(req_id))

    def _forget_stream(self, stream: SynthesisStream) -> None:
        if self._streams.get(stream.req_id) is stream:
            del self._streams[stream.req_id]

    def _fail_open_streams(self, reason: str, cause: BaseException | None = None) -> None:
        for stream in list(self._streams.values()):
            error = EngineClosed(reason)
            error.__cause__ = cause
            stream._push_end(error)
        for future in list(self._calls):
            if not future.done():
                future.set_exception(EngineClosed(reason))
        self._calls.clear()

    def _on_thread_stopped(self, crash: BaseException | None) -> None:
        self._is_closed = True
        self._fail_open_streams(f"engine thread crashed: {crash!r}" if crash else "engine closed", crash)
        if self._stopped is not None and not self._stopped.done():
            self._stopped.set_result(None)

    # -- engine thread -------------------------------------------------------------------------------

    def _run(self) -> None:
        crash: BaseException | None = None
        try:
            while not self._is_shutting_down:
                self._process_inbox(block=not self._has_work())
                if not self._is_shutting_down:
                    self._step()
        except _LoopGone:
            logger.warning("event loop closed under the TTS engine; stopping its thread")
        except BaseException as exc:  # noqa: BLE001 - reported to every open stream, then the thread ends
            logger.exception("TTS engine thread crashed")
            crash = self._crash = exc
        finally:
            self._finish_requests(list(self._requests), RequestStatus.FINISHED_CLOSED)
            try:
                self._backend.close()
            except Exception:  # noqa: BLE001
                logger.exception("closing the %s backend failed", self.backend_name)
            try:
                self._post(self._on_thread_stopped, crash)
            except _LoopGone:
                pass  # nobody is waiting

    def _has_work(self) -> bool:
        if self._waiting:
            return True
        return any(r.credit.get_num_buffered() < self.max_buffered_chunks for r in self._running)

    def _process_inbox(self, *, block: bool) -> None:
        """Apply every command in the inbox, first waiting for one if ``block``. Stops at a shutdown."""
        try:
            command = self._inbox.get() if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            if isinstance(command, _Shutdown):
                self._is_shutting_down = True
                return
            if isinstance(command, _NewRequest):
                self._num_received += 1
                self._requests[command.request.req_id] = command.request
                self._waiting.append(command.request)
            elif isinstance(command, _Abort):
                self._finish_requests([command.req_id], RequestStatus.FINISHED_ABORTED)
            elif isinstance(command, _Call):
                self._run_call(command)
            try:
                command = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _run_call(self, call: _Call) -> None:
        result: Any = None
        error: BaseException | None = None
        try:
            result = call.fn()
        except Exception as exc:  # noqa: BLE001 - handed to the caller on the loop
            error = exc
        voices: Any = None
        try:
            voices = (list(self._backend.voices()), self._backend.default_voice)
        except Exception:  # noqa: BLE001 - keep the old list
            logger.exception("reading the voices of the %s backend failed", self.backend_name)
        self._post(self._finish_call, (call.future, result, error, voices))

    def _open_backend_stream(self, request: EngineRequest) -> Any:
        backend = self._backend
        instruct = request.instruct if backend.supports_instruct else None
        if request.prompt_audio is not None:
            return backend.open_zero_shot_stream(
                request.text, request.prompt_audio, request.prompt_text, request.speed, instruct
            )
        if instruct is not None:
            return backend.open_stream(request.text, request.voice, request.speed, instruct=instruct)
        return backend.open_stream(request.text, request.voice, request.speed)

    def _step(self) -> None:
        """schedule -> backend -> drain aborts -> update."""
        plan = self._schedule()
        if not plan:
            return
        self._counts["steps_total"] += 1
        self._counts["step_streams_total"] += len(plan)
        try:
            outputs: list[Any] = list(self._backend.step([r.backend_stream for r in plan]))
            if len(outputs) != len(plan):
                raise EngineError(f"backend returned {len(outputs)} results for {len(plan)} streams")
        except Exception as exc:  # noqa: BLE001 - the whole batch failed; the engine goes on
            outputs = [exc] * len(plan)
        self._process_inbox(block=False)  # aborts that arrived during the step win over its output
        if self._is_shutting_down:
            return
        self._update_from_output(plan, outputs)

    def _schedule(self) -> list[EngineRequest]:
        """Open waiting requests, then pick runnable ones: least buffered first, new before old."""
        while self._waiting:
            request = self._waiting.pop(0)
            try:
                request.backend_stream = self._open_backend_stream(request)
                request.resampler = StreamingResampler(self._backend.sample_rate, request.sample_rate)
            except Exception as exc:  # noqa: BLE001 - fails this request only
                self._finish_requests([request.req_id], RequestStatus.FINISHED_FAILED, exc)
                continue
            request.status = RequestStatus.RUNNING
            self._running.append(request)
        bound = self.max_buffered_chunks
        runnable = [r for r in self._running if r.credit.get_num_buffered() < bound]
        runnable.sort(key=lambda r: (r.credit.get_num_buffered(), r.num_chunks > 0, r.arrival_time))
        return runnable[: max(1, self._backend.max_batch_size)]

    def _update_from_output(self, plan: list[EngineRequest], outputs: list[Any]) -> None:
        for request, output in zip(plan, outputs, strict=True):
            if request.status.is_finished():
                continue  # aborted while the step ran: its output is dropped
            if isinstance(output, BaseException):
                self._finish_requests([request.req_id], RequestStatus.FINISHED_FAILED, output)
                continue
            try:
                self._deliver(request, request.flush_pcm() if output is None else request.to_pcm(output))
            except _LoopGone:
                raise
            except Exception as exc:  # noqa: BLE001 - a bad chunk fails only its request
                self._finish_requests([request.req_id], RequestStatus.FINISHED_FAILED, exc)
                continue
            if output is None:
                self._finish_requests([request.req_id], RequestStatus.FINISHED_STOPPED)

    def _deliver(self, request: EngineRequest, pcm: np.ndarray) -> None:
        if pcm.size == 0:
            return  # the resampler is still filling its window
        request.num_chunks += 1
        request.credit.num_produced += 1
        self._counts["chunks_total"] += 1
        self._counts["samples_total"] += pcm.size
        self._post(request.stream._push_chunk, pcm)

    def _finish_requests(
        self, req_ids: list[str], status: RequestStatus, error: BaseException | None = None
    ) -> None:
        """The one way out: take requests off the queues, close their backend streams, tell their streams."""
        finished: list[EngineRequest] = []
        for req_id in req_ids:
            request = self._requests.pop(req_id, None)
            if request is None or request.status.is_finished():
                continue
            request.status = status
            finished.append(request)
            if request.backend_stream is not None:
                try:
                    request.backend_stream.close()
                except Exception:  # noqa: BLE001
                    logger.exception("closing the backend stream of %s failed", req_id)
        if not finished:
            return
        done = {id(r) for r in finished}
        self._waiting = [r for r in self._waiting if id(r) not in done]
        self._running = [r for r in self._running if id(r) not in done]
        for request in finished:
            if status == RequestStatus.FINISHED_STOPPED:
                self._counts["requests_finished"] += 1
                self._post(request.stream._push_end, None)
            elif status == RequestStatus.FINISHED_FAILED:
                self._counts["requests_failed"] += 1
                cause = error if error is not None else EngineError("unknown failure")
                logger.warning("TTS request %s failed: %r", request.req_id, cause)
                self._post(request.stream._push_end, SynthesisFailed(request.req_id, cause))
            elif status == RequestStatus.FINISHED_ABORTED:
                self._counts["requests_aborted"] += 1
            # FINISHED_CLOSED: the loop side fails open streams itself once the thread has stopped.

    def _post(self, callback: Callable[[Any], None], arg: Any) -> None:
        """Run ``callback(arg)`` on the event loop."""
        loop = self._loop
        if loop is None:
            raise _LoopGone("engine was never started")
        try:
            loop.call_soon_threadsafe(callback, arg)
        except RuntimeError as exc:  # the loop is closed
            raise _LoopGone from exc


def _check_instruct(instruct: str | None) -> str | None:
    if instruct is None:
        return None
    if not isinstance(instruct, str):
        raise ValueError(f"instruct must be a string or None, got {type(instruct).__name__}")
    if len(instruct) > MAX_INSTRUCT_CHARS:
        raise ValueError(f"instruct is longer than {MAX_INSTRUCT_CHARS} characters")
    return instruct.strip() or None


def _check_arguments(text: str, sample_rate: int, speed: float) -> None:
    if not isinstance(text, str):
        raise TypeError(f"text must be str, got {type(text).__name__}")
    if isinstance(sample_rate, bool) or sample_rate not in SUPPORTED_SAMPLE_RATES:
        raise ValueError(f"sample_rate must be one of {SUPPORTED_SAMPLE_RATES}, got {sample_rate!r}")
    if isinstance(speed, bool) or not isinstance(speed, int | float) or not MIN_SPEED <= speed <= MAX_SPEED:
        raise ValueError(f"speed must be a number in [{MIN_SPEED}, {MAX_SPEED}], got {speed!r}")

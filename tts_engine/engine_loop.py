"""The engine loop: the one thread that owns every backend call, composed into ``TTSEngine``.

``EngineLoop`` owns the backend, the ``Scheduler`` and the inbox, and runs in its own thread: it blocks
on the inbox when the scheduler has no work, applies inbox commands, runs one step (schedule -> park or
resume batch streams -> backend within the plan's budget -> drain aborts -> update -> batched
post-processing -> delivery) and has the one way out (``_finish_requests``). A backend that
``splits_steps`` hands the audio of a step's urgent lane out mid-step (``on_chunks``): it is
post-processed and delivered at once, before the rest of the step's work runs; and it leaves that rest
for the next step when a device or interactive request has arrived meanwhile (``should_yield``). Its public
methods (``submit``, ``abort``, ``resume``, ``call``, ``shutdown``) may be called from any thread: they
only put a command in the inbox (its commands: tts_engine/engine_inbox.py). Results reach the event loop
only through ``loop.call_soon_threadsafe``: chunks and ends go to each request's ``SynthesisStream``, a
``call``'s outcome to ``on_call_done`` and the thread's end to ``on_stopped`` (both given by the owner,
``TTSEngine`` in tts_engine/engine.py, which is the event-loop API).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, cast

import numpy as np

from tts_engine.backends.base import Backend, BackendStream, SplitStepper
from tts_engine.engine_inbox import (
    RESUME,
    SHUTDOWN,
    Abort,
    Call,
    CallOutcome,
    Command,
    Inbox,
    NewRequests,
    Shutdown,
)
from tts_engine.errors import EngineError, EngineOverloaded, SynthesisFailed
from tts_engine.postprocess import postprocess_chunks
from tts_engine.request import EngineRequest, RequestStatus
from tts_engine.resample import StreamingResampler
from tts_engine.scheduler import Scheduler
from tts_engine.step_plan import StepPlan

logger = logging.getLogger("tts_engine.engine")

__all__ = ["CallOutcome", "EngineLoop", "Inbox"]


class _LoopGone(Exception):
    """The event loop the engine was started on is closed; nobody can receive output any more."""


class EngineLoop:
    """The engine thread: owns ``backend``, its ``scheduler`` and the inbox; started on an event loop."""

    def __init__(
        self,
        backend: Backend,
        *,
        max_buffered_chunks: int,
        max_queue_wait_s: float | None,
        text_normalizer: Callable[[str], str] | None,
        on_call_done: Callable[[CallOutcome], None],
        on_stopped: Callable[[BaseException | None], None],
    ) -> None:
        self._backend = backend
        self.backend_name = backend.name
        # tts.text_normalization; None (also for backends that read raw text): the text as written
        self.normalize_text = None if backend.reads_raw_text else text_normalizer
        self.scheduler = Scheduler(
            limits=backend.limits(),
            max_buffered_chunks=max_buffered_chunks,
            max_queue_wait_s=max_queue_wait_s,
        )
        self.max_queue_wait_s = max_queue_wait_s
        self._inbox: queue.Queue[Command] = Inbox(backend)
        self._on_call_done = on_call_done
        self._on_stopped = on_stopped
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        # Written by the engine thread only.
        self.num_received = 0  # requests taken from the inbox
        self.counts = dict.fromkeys(
            ("requests_finished", "requests_failed", "requests_aborted", "chunks_total", "samples_total",
             "steps_total", "step_streams_total", "chunks_early"),
            0,
        )  # fmt: skip
        self.busy_seconds = 0.0  # time spent in steps (the engine's busy share: its rate of growth)
        self._is_shutting_down = False
        self.crash: BaseException | None = None
        # when the step under way began (time.monotonic()); None between steps. Read from the loop: a
        # step that runs far longer than any should is a stuck engine (the worker's watchdog, issue 23)
        self.step_started: float | None = None
        # set by submit (any thread) once a device or interactive request is in the inbox; cleared when the
        # inbox is read. A backend that splits its steps ends a step early on it (after the step's urgent
        # audio), so its first audio waits for no work that can wait (a batch request's first audio can)
        self._arrivals = threading.Event()

    # -- any thread ----------------------------------------------------------------------------------

    @property
    def is_started(self) -> bool:
        return self._thread is not None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start the thread; its results go to ``loop``."""
        if self._thread is not None:
            raise EngineError("engine already started")
        self._loop = loop
        self._thread = threading.Thread(target=self._run, name=f"tts-engine-{self.backend_name}", daemon=True)
        self._thread.start()

    def step_running_s(self) -> float:
        """How long the step under way has been running (0 between steps); any thread."""
        started = self.step_started
        return 0.0 if started is None else max(0.0, time.monotonic() - started)

    def join(self, timeout: float) -> None:
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=timeout)

    def submit(self, request: EngineRequest) -> None:
        self.submit_many([request])

    def submit_many(self, requests: list[EngineRequest]) -> None:
        """Hand several requests over as one command: the step that admits one admits them all."""
        if requests:
            self._inbox.put(NewRequests(tuple(requests)))
            if any(not request.is_batch for request in requests):
                self._arrivals.set()

    def abort(self, req_id: str) -> None:
        self._inbox.put(Abort(req_id))

    def resume(self) -> None:
        """A consumer made room under the buffer bound: its request is runnable again."""
        self._inbox.put(RESUME)

    def call(self, fn: Callable[[], Any], future: asyncio.Future[Any]) -> None:
        """Run ``fn`` in the engine thread between two steps; the outcome goes to ``on_call_done``."""
        self._inbox.put(Call(fn, future))

    def shutdown(self) -> None:
        """Stop after the current step; the thread closes the backend and calls ``on_stopped``."""
        self._inbox.put(SHUTDOWN)

    # -- the engine thread ---------------------------------------------------------------------------

    def _run(self) -> None:
        crash: BaseException | None = None
        try:
            scheduler = self.scheduler
            while not self._is_shutting_down:
                block = not scheduler.has_work()
                self._process_inbox(block=block, timeout=scheduler.get_wait_timeout() if block else None)
                if not self._is_shutting_down:
                    started = self.step_started = time.monotonic()
                    try:
                        self._step()
                    finally:
                        self.step_started = None
                        self.busy_seconds += time.monotonic() - started
        except _LoopGone:
            logger.warning("event loop closed under the TTS engine; stopping its thread")
        except BaseException as exc:  # noqa: BLE001 - reported to every open stream, then the thread ends
            logger.exception("TTS engine thread crashed")
            crash = self.crash = exc
        finally:
            self._finish_requests(list(self.scheduler.requests), RequestStatus.FINISHED_CLOSED)
            try:
                self._backend.close()
            except Exception:  # noqa: BLE001
                logger.exception("closing the %s backend failed", self.backend_name)
            try:
                self._post(self._on_stopped, crash)
            except _LoopGone:
                pass  # nobody is waiting

    def _process_inbox(self, *, block: bool, timeout: float | None = None) -> None:
        """Apply every command in the inbox, first waiting for one (at most ``timeout`` s) if ``block``."""
        self._arrivals.clear()
        try:
            command = self._inbox.get(timeout=timeout) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        self._arrivals.clear()  # the request that ended a blocking wait is read now, not a newcomer
        while True:
            if isinstance(command, Shutdown):
                self._is_shutting_down = True
                return
            if isinstance(command, NewRequests):
                self.num_received += len(command.requests)
                for request in command.requests:
                    self.scheduler.add_request(request)
            elif isinstance(command, Abort):
                self._finish_requests([command.req_id], RequestStatus.FINISHED_ABORTED)
            elif isinstance(command, Call):
                self._run_call(command)
            try:
                command = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _run_call(self, call: Call) -> None:
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
        self._post(self._on_call_done, (call.future, result, error, voices))

    def _open_backend_stream(self, request: EngineRequest) -> Any:
        backend = self._backend
        if self.normalize_text is not None:  # here, not on the event loop that paces every device's audio
            request.text = self.normalize_text(request.text)
        instruct = request.instruct if backend.supports_instruct else None
        if request.prompt_audio is not None:
            return backend.open_zero_shot_stream(
                request.text, request.prompt_audio, request.prompt_text, request.speed, instruct
            )
        if instruct is not None:
            return backend.open_stream(request.text, request.voice, request.speed, instruct=instruct)
        return backend.open_stream(request.text, request.voice, request.speed)

    def _step(self) -> None:
        """schedule -> backend -> drain aborts -> update -> batched post-processing -> delivery."""
        scheduler = self.scheduler
        plan = scheduler.schedule()
        for req_id in plan.timed_out_req_ids:
            waited = self.max_queue_wait_s
            error = EngineOverloaded(f"request {req_id} waited {waited} s for capacity and got none")
            self._finish_requests([req_id], RequestStatus.FINISHED_FAILED, error)
        self._park_and_resume(plan)
        self._open_new(plan)
        scheduled = [r for r in plan.scheduled if not r.status.is_finished()]
        if len(scheduled) != len(plan.scheduled):
            plan.budget = plan.budget.only([not r.status.is_finished() for r in plan.scheduled])
        plan.scheduled = scheduled
        if not scheduled:
            return
        self.counts["steps_total"] += 1
        self.counts["step_streams_total"] += len(scheduled)
        try:
            streams = [_opened(r) for r in scheduled]
            budget = plan.budget  # passed only when it caps something: uncapped backends keep step(streams)
            if self.scheduler.limits.splits_steps:
                splitter = cast(SplitStepper, self._backend)  # its limits say so
                outputs: list[Any] = list(
                    splitter.step(
                        streams,
                        budget,
                        on_chunks=lambda items: self._deliver_early(plan, items),
                        should_yield=self._arrivals.is_set,
                    )
                )
            elif budget.is_capped:
                outputs = list(self._backend.step(streams, budget))
            else:
                outputs = list(self._backend.step(streams))
            if len(outputs) != len(scheduled):
                raise EngineError(f"backend returned {len(outputs)} results for {len(scheduled)} streams")
        except Exception as exc:  # noqa: BLE001 - the whole batch failed; the engine goes on
            outputs = [exc] * len(scheduled)
        self._process_inbox(block=False)  # aborts that arrived during the step win over its output
        if self._is_shutting_down:
            return
        result = scheduler.update_from_output(plan, outputs)
        for request, failure in result.failed:
            self._finish_requests([request.req_id], RequestStatus.FINISHED_FAILED, failure)
        chunks = [(r, c) for r, c in result.chunks if not _is_empty(c)]
        for (request, _), pcm in zip(chunks, postprocess_chunks(chunks), strict=True):
            self._deliver_or_fail(request, pcm)
        for request in result.stopped:
            try:
                pcm = request.flush_pcm()
            except Exception as exc:  # noqa: BLE001 - a bad tail fails only its request
                pcm = exc
            if self._deliver_or_fail(request, pcm):
                self._finish_requests([request.req_id], RequestStatus.FINISHED_STOPPED)

    def _park_and_resume(self, plan: StepPlan) -> None:
        """Batch streams give their capacity up (parked, state kept) or take it back; a failure fails that
        request (which frees its capacity too)."""
        for request, park in [(r, True) for r in plan.parked] + [(r, False) for r in plan.unparked]:
            try:
                stream = _opened(request)
                if park and not self._backend.park(stream):
                    raise EngineError(f"the {self.backend_name} backend could not park request {request.req_id}")
                if not park:
                    self._backend.unpark(stream)
            except Exception as exc:  # noqa: BLE001 - fails this request only
                self._finish_requests([request.req_id], RequestStatus.FINISHED_FAILED, exc)

    def _deliver_early(self, plan: StepPlan, items: list[tuple[int, Any]]) -> None:
        """Audio a backend handed out mid-step (its urgent lane): post-processed and delivered now."""
        chunks = [
            (plan.scheduled[i], chunk)
            for i, chunk in items
            if not plan.scheduled[i].status.is_finished() and not _is_empty(chunk)
        ]
        self.counts["chunks_early"] += len(chunks)
        for (request, _), pcm in zip(chunks, postprocess_chunks(chunks), strict=True):
            self._deliver_or_fail(request, pcm)

    def _open_new(self, plan: StepPlan) -> None:
        """Open the backend streams of the requests admitted this step; a failure fails that request."""
        for request in plan.new_requests:
            try:
                request.backend_stream = self._open_backend_stream(request)
                request.resampler = StreamingResampler(
                    self._backend.sample_rate, request.output_rate, device=self._backend.device
                )
            except Exception as exc:  # noqa: BLE001 - fails this request only
                self._finish_requests([request.req_id], RequestStatus.FINISHED_FAILED, exc)

    def _deliver_or_fail(self, request: EngineRequest, pcm: np.ndarray | BaseException) -> bool:
        if isinstance(pcm, BaseException):
            self._finish_requests([request.req_id], RequestStatus.FINISHED_FAILED, pcm)
            return False
        self._deliver(request, pcm)
        return True

    def _deliver(self, request: EngineRequest, pcm: np.ndarray) -> None:
        if pcm.size == 0:
            return  # the resampler is still filling its window
        if request.first_chunk_step is None:
            request.first_chunk_step = self.scheduler.num_step_calls
        request.num_chunks += 1
        request.credit.num_produced += 1
        self.counts["chunks_total"] += 1
        self.counts["samples_total"] += pcm.size
        request.credit.samples_produced += pcm.size
        self._post(request.stream._push_chunk, pcm)

    def _finish_requests(
        self, req_ids: list[str], status: RequestStatus, error: BaseException | None = None
    ) -> None:
        """The one way out: the scheduler drops them, their backend streams close, their streams hear."""
        finished = self.scheduler.finish_requests(req_ids, status)
        for request in finished:
            if request.backend_stream is not None:
                try:
                    request.backend_stream.close()
                except Exception:  # noqa: BLE001
                    logger.exception("closing the backend stream of %s failed", request.req_id)
        for request in finished:
            if status == RequestStatus.FINISHED_STOPPED:
                self.counts["requests_finished"] += 1
                self._post(request.stream.finish, None)
            elif status == RequestStatus.FINISHED_FAILED:
                self.counts["requests_failed"] += 1
                cause = error if error is not None else EngineError("unknown failure")
                logger.warning("TTS request %s failed: %r", request.req_id, cause)
                if not isinstance(cause, EngineOverloaded):  # a timed-out wait raises EngineOverloaded itself
                    cause = SynthesisFailed(request.req_id, cause)
                self._post(request.stream.finish, cause)
            elif status == RequestStatus.FINISHED_ABORTED:
                self.counts["requests_aborted"] += 1
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


def _opened(request: EngineRequest) -> BackendStream:
    """A scheduled request's backend stream (the scheduler schedules opened requests only)."""
    if request.backend_stream is None:
        raise EngineError(f"request {request.req_id} was scheduled before its stream opened")
    return request.backend_stream


def _is_empty(chunk: Any) -> bool:
    size = getattr(chunk, "size", None)
    if callable(size):  # torch.Tensor.size() is a method
        return chunk.numel() == 0
    return size == 0

"""``EngineClient``: the engine interface (``SpeechEngine``, tts_engine/interface.py) served by engine
worker processes (docs/engine-workers.md).

Device sessions and the HTTP/WS API use it exactly like an in-process ``TTSEngine``: ``synthesize()``
returns a ``SynthesisStream`` (a ``RemoteStream``) at once, ``abort()``, ``add_voice()``,
``remove_voice()``, ``health()``, ``stats``, ``voices``... Behind it are ``WorkerSlot``s, one per worker
(started here, or ``engine.remote`` addresses). Routing: each request goes to the ready worker with the
most free capacity (its latest report, or this client's own in-flight count where that is larger). A
worker that goes away fails only its own in-flight requests (``WorkerLost``, an ``EngineUnavailable``:
the device speaks its apology, the API answers 503) and its slot restarts it; requests go to the others
meanwhile, and with none ready ``synthesize()`` raises ``EngineUnavailable`` at once. Voices added at
run time are sent to every worker and replayed to each one that (re)connects.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gateway.engine_client.link import RemoteStream, WorkerLink, summed_memory
from gateway.engine_client.workers import WorkerSlot
from tts_engine.arguments import (
    check_arguments,
    check_instruct,
    check_priority,
    check_req_id,
    check_text_length,
    check_zero_shot,
)
from tts_engine.engine_properties import EngineProperties
from tts_engine.errors import EngineClosed, EngineError, EngineOverloaded, EngineUnavailable
from tts_engine.interface import DEFAULT_PRIORITY, EngineInfo, Priority
from tts_engine.request import SynthesisStream
from tts_engine.voices import VoiceError, VoicePreset, decode_prompt_wav
from tts_engine.worker import frames as f

log = logging.getLogger(__name__)

NOT_CONNECTED = EngineInfo(backend="", sample_rate=0)  # what the client is before a worker's hello


class EngineClient(EngineProperties):
    """The engine interface over one or more engine workers."""

    def __init__(
        self, slots: list[WorkerSlot], *, max_pending_requests: int = 256, start_timeout_s: float = 300.0
    ):
        if not slots:
            raise ValueError("EngineClient needs at least one worker")
        self.slots = slots
        self.max_pending_requests = max_pending_requests  # this gateway's cap on its open requests
        self.start_timeout_s = start_timeout_s
        for slot in slots:
            slot._on_ready = self._replay_voices
        self._info = NOT_CONNECTED  # from the first worker's hello
        self._voices: list[str] = []
        self._default_voice = ""
        self._added: dict[str, VoicePreset] = {}  # run-time voices, replayed to every (re)connected worker
        self._removed: set[str] = set()  # built-in voices removed at run time
        self._streams: dict[str, RemoteStream] = {}
        self._tie_turn = 0  # which of the workers tied for the most free capacity takes the next request
        self._is_running = False
        self._is_closed = False
        self._counts = {"requests_total": 0, "requests_rejected": 0, "requests_failed": 0}
        self.on_closed: Callable[[], None] | None = None  # cleanup once every worker has stopped

    # -- properties (from the first worker's hello; the rest: tts_engine/engine_properties.py) ----

    @property
    def info(self) -> EngineInfo:
        return self._info

    @property
    def max_buffered_chunks(self) -> int:
        return self._info.max_buffered_chunks

    @property
    def is_running(self) -> bool:
        return self._is_running and not self._is_closed

    @property
    def stats(self) -> dict[str, int | float]:
        links = [slot.link for slot in self.slots if slot.link is not None]
        return {
            **self._counts,
            "live": len(self._streams),
            "queue_depth": 0,
            "workers": len(self.slots),
            "workers_ready": sum(1 for link in links if link.is_ready),
            "worker_stalls": sum(link.counts["stalls"] for link in links) + sum(s.stalls for s in self.slots),
            "worker_restarts": sum(slot.restarts for slot in self.slots),
            "link_protocol_errors": sum(link.counts["protocol_errors"] for link in links),
            "link_outbox_full": sum(link.counts["outbox_full"] for link in links),
            # engine steps of the ready workers, as of their latest report (sent with each request's end)
            "steps_total": sum(link.report.steps_total for link in links),
            **summed_memory(links),
        }

    def health(self) -> dict[str, Any]:
        stats = self.stats
        workers = [slot.health() for slot in self.slots]
        ready = [w for w in workers if w["state"] == "ready"]
        return {
            **self._info.as_dict(),
            "max_pending_requests": self.max_pending_requests,
            "voices": self.voices,
            "default_voice": self.default_voice,
            # running: a worker takes requests; unavailable: none does now (restarting, stalled, failed)
            "state": "closed" if self._is_closed else "running" if ready
            else "unavailable" if self._is_running else "new",  # fmt: skip
            "unavailable_reason": None if ready else _why_none_ready(workers),
            "live_requests": stats["live"],
            "open_streams": stats["live"],
            "queue_depth": 0,
            "requests_total": stats["requests_total"],
            "errors": stats["requests_failed"],
            "batching": {"capacity": sum(w["capacity"] or 0 for w in ready)},
            "memory": summed_memory([slot.link for slot in self.slots if slot.link is not None]),
            "workers": workers,
            "stats": stats,
        }

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start every slot and wait for each worker's first hello (or failure); at least one must be ready."""
        if self._is_closed:
            raise EngineClosed("engine client is closed")
        for slot in self.slots:
            slot.start()
        waits = [asyncio.shield(slot.first_ready) for slot in self.slots if slot.first_ready is not None]
        try:
            async with asyncio.timeout(self.start_timeout_s):
                outcomes = await asyncio.gather(*waits, return_exceptions=True)
        except TimeoutError:
            outcomes = [TimeoutError(f"not ready within {self.start_timeout_s:.0f} s")]
        if self._info is NOT_CONNECTED:
            errors = [o for o in outcomes if isinstance(o, BaseException)]
            await self.close()  # stop the slots' retries and their processes; nothing is left behind
            raise EngineUnavailable(f"no engine worker started: {errors[0] if errors else 'unknown'}")
        for slot, outcome in zip(self.slots, outcomes, strict=False):
            if isinstance(outcome, BaseException):
                log.error(
                    "engine worker %s did not start (%s); serving with the others", slot.address, outcome
                )
        self._is_running = True

    async def close(self) -> None:
        self._is_closed = True
        await asyncio.gather(*(slot.close() for slot in self.slots))
        for stream in list(self._streams.values()):
            stream.finish(EngineClosed("engine closed"))
        if self.on_closed is not None:
            self.on_closed()

    async def _replay_voices(self, link: WorkerLink) -> None:
        """A worker (re)connected: make its voice set the gateway's before it takes requests."""
        link.on_voices = self._voices_changed
        assert link.hello is not None
        if self._info is NOT_CONNECTED:
            self._info = link.hello.info
            self._voices = list(link.hello.voices)
            self._default_voice = link.hello.default_voice
        for name in self._removed:
            if name in link.hello.voices:
                await link.call(f.VoiceRemove(call=0, name=name))
        for preset in list(self._added.values()):
            try:
                await link.call(await _voice_add_message(preset))
            except (EngineError, VoiceError, ValueError) as exc:
                log.warning("voice %r not available on engine worker %s: %s", preset.name, link.address, exc)

    # -- requests --------------------------------------------------------------------------------

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
        """Like ``TTSEngine.synthesize()``: queued on the worker with the most free capacity."""
        check_arguments(text, output_rate, speed)
        check_text_length(text, self.max_text_chars)
        message = f.Synth(id="", text=text, voice=self.resolve_voice(voice), rate=output_rate, speed=float(speed),
                          instruct=check_instruct(instruct), ahead=float(playback_ahead),
                          priority=check_priority(priority))  # fmt: skip
        return self._submit(message, req_id)

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
        check_arguments(text, output_rate, speed)
        check_text_length(text, self.max_text_chars)
        prompt_text = check_zero_shot(self.backend_name, self.supports_cloning, prompt_text)
        decode_prompt_wav(prompt_wav)  # a bad recording is refused here, as in process
        message = f.Synth(id="", text=text, rate=output_rate, speed=float(speed), instruct=check_instruct(instruct),
                          prompt_wav=bytes(prompt_wav), prompt_text=prompt_text,
                          priority=check_priority(priority))  # fmt: skip
        return self._submit(message, req_id)

    def _submit(self, message: f.Synth, req_id: str | None) -> SynthesisStream:
        if self._is_closed:
            raise EngineClosed("engine is closed")
        req_id = check_req_id(req_id, self._streams)
        if len(self._streams) >= self.max_pending_requests:
            self._counts["requests_rejected"] += 1
            raise EngineOverloaded(f"too many pending requests (limit {self.max_pending_requests})")
        link = self._pick()
        self._counts["requests_total"] += 1
        stream = RemoteStream(link, req_id, message.rate, message.ahead)
        if not message.text.strip():
            stream.finish()
            return stream
        self._streams[req_id] = stream
        stream.add_done_callback(self._stream_done)
        link.submit(stream, dataclasses.replace(message, id=req_id))
        return stream

    def _pick(self) -> WorkerLink:
        links = [slot.link for slot in self.slots if slot.link is not None and slot.link.is_ready]
        if not links:
            self._counts["requests_rejected"] += 1
            states = ", ".join(f"{slot.address}: {slot.state}" for slot in self.slots)
            raise EngineUnavailable(f"no engine worker is ready ({states})")
        most = max(link.free() for link in links)
        tied = [link for link in links if link.free() == most]
        self._tie_turn += 1  # ties (idle workers) in turn, so requests that never overlap still spread
        return tied[self._tie_turn % len(tied)]

    def _stream_done(self, stream: SynthesisStream) -> None:
        self._streams.pop(stream.req_id, None)
        if stream.error is not None:
            self._counts["requests_failed"] += 1

    # -- voices ----------------------------------------------------------------------------------

    async def add_voice(self, preset: VoicePreset) -> None:
        """Prepare ``preset`` on every ready worker; the first refusal raises (and others undo nothing)."""
        self._check_cloning()
        await self._call_all(await _voice_add_message(preset))
        self._added[preset.name] = preset
        self._removed.discard(preset.name)

    async def remove_voice(self, name: str) -> None:
        self._check_cloning()
        await self._call_all(f.VoiceRemove(call=0, name=name))
        if self._added.pop(name, None) is None:
            self._removed.add(name)

    def _voices_changed(self, message: f.VoicesChanged) -> None:
        """Another gateway added or removed a voice on a worker: offer what the worker offers now, and
        never replay a voice that was removed since (nor re-remove one added since)."""
        self._voices = list(message.voices)
        self._default_voice = message.default_voice or self._default_voice
        if message.change == "remove":
            if self._added.pop(message.name, None) is None:
                self._removed.add(message.name)
        elif message.change == "add":
            self._removed.discard(message.name)
            self._added.pop(message.name, None)  # the other gateway's version is the voice now: it replays it

    async def _call_all(self, message: f.VoiceAdd | f.VoiceRemove) -> None:
        links = [slot.link for slot in self.slots if slot.link is not None and slot.link.is_ready]
        if not links:
            raise EngineUnavailable("no engine worker is ready")
        results = await asyncio.gather(*(link.call(message) for link in links), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        answers = [r for r in results if isinstance(r, f.Result)]
        if answers:
            self._voices = list(answers[0].voices)
            self._default_voice = answers[0].default_voice or self._default_voice
        refusals = [e for e in errors if not isinstance(e, EngineUnavailable)]
        if refusals or not answers:
            raise (refusals or errors)[0]


def _why_none_ready(workers: list[dict[str, Any]]) -> str:
    """Why no worker takes requests: each worker's state and last error."""
    parts = []
    for worker in workers:
        why = worker.get("stalled") or worker.get("last_error")
        parts.append(f"{worker['address']}: {worker['state']}" + (f" ({why})" if why else ""))
    return "no engine worker is ready: " + "; ".join(parts)


async def _voice_add_message(preset: VoicePreset) -> f.VoiceAdd:
    wav = None
    if preset.prompt_wav is not None:
        wav = await asyncio.to_thread(Path(preset.prompt_wav).read_bytes)
    return f.VoiceAdd(call=0, name=preset.name, prompt_wav=wav, prompt_text=preset.prompt_text,
                      instruct=preset.instruct, description=preset.description)  # fmt: skip

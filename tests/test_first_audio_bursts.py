"""First audio under load (tiny CosyVoice model; issue 25): a newcomer's opening tokens come in a decode
burst, not one a step, and a step that a new request arrives in leaves its short-lane work for the next.

Steps are counted, not seconds (``EngineRequest.arrival_step`` / ``first_chunk_step``), so the tests hold
on any machine.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from cosyvoice.model import CosyVoice3
from gateway.voices.store import VoiceStore
from scripts.make_tiny_model import make_model_dir
from tests.test_backend_cosyvoice import prompt_wav
from tts_engine import TTSEngine
from tts_engine.backends.cosyvoice import CosyVoiceBackend
from tts_engine.backends.cosyvoice.request import CosyVoiceStream
from tts_engine.budget import Lane, StepBudget
from tts_engine.request import EngineRequest

PLAYING = ("我们可以一起去公园散步，顺便看看湖边新开的花。", "The station is about twenty minutes from here.")
NEWCOMER = "你好，我在这里。"


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> CosyVoice3:
    model_dir = make_model_dir(tmp_path_factory.mktemp("cosyvoice") / "model", "tiny", seed=0)
    return CosyVoice3.from_pretrained(model_dir, max_seconds=60)


@pytest.fixture(scope="module")
def voices(tmp_path_factory: pytest.TempPathFactory) -> VoiceStore:
    store = VoiceStore(tmp_path_factory.mktemp("voices"))
    store.add("default", prompt_wav(2.0), "希望你以后能够做的比我还好呦。")
    return store


def make_backend(model: CosyVoice3, voices: VoiceStore, burst: int) -> CosyVoiceBackend:
    backend = CosyVoiceBackend(
        model=model, seed=3, max_batch_size=4, max_llm_len=512, voice_cache_dir=voices.cache_dir,
        fixed_llm_tokens=120,
    )  # fmt: skip
    backend.stepper.decode_burst = burst
    for preset in voices.presets():
        backend.add_voice(preset)
    return backend


def playing_and_newcomer(backend: CosyVoiceBackend) -> tuple[CosyVoiceStream, CosyVoiceStream]:
    """A stream past its opening hop whose next hop's tokens are there, and a newcomer not yet stepped."""
    playing, newcomer = (backend.open_stream(t, "default", 1.0) for t in (PLAYING[0], NEWCOMER))
    urgent = StepBudget(lanes=(Lane.URGENT,))
    while not backend.step([playing], urgent)[0].size:  # its opening hop (audio: a tensor; none: empty)
        pass
    tokens_only = StepBudget(lanes=(Lane.COMFORTABLE,), hop_rows=0)  # no flow call, no closing slice begun
    for _ in range(200):  # until its next hop's tokens are there (or, its LLM ended, its closing pass's)
        playing.feed_tokens()
        if playing.next_job() is not None:
            break
        backend.step([playing], tokens_only)
    assert playing.next_job() is not None and id(playing) not in backend.stepper.under_way
    return playing, newcomer


async def read_all(stream) -> np.ndarray:
    async with asyncio.timeout(120):
        return np.concatenate([chunk async for chunk in stream])


async def newcomer_steps(model: CosyVoice3, voices: VoiceStore, burst: int) -> tuple[int, np.ndarray, dict]:
    """Engine steps from a newcomer's arrival to its first chunk while two replies are mid-way."""
    engine = TTSEngine(make_backend(model, voices, burst), max_buffered_chunks=2, max_queue_wait_s=None)
    scheduler = engine._engine.scheduler
    seen: list[EngineRequest] = []
    add = scheduler.add_request
    scheduler.add_request = lambda r: (seen.append(r), add(r))[-1]  # type: ignore[method-assign]
    await engine.start()
    try:
        playing = [engine.synthesize(t, output_rate=16000, priority="device") for t in PLAYING]
        readers = [asyncio.create_task(read_all(s)) for s in playing]
        async with asyncio.timeout(60):  # both mid-reply: audio out, LLM still running
            while engine.stats["chunks_total"] < 2 * len(PLAYING):
                await asyncio.sleep(0.005)
        audio = await read_all(engine.synthesize(NEWCOMER, output_rate=16000, priority="device"))
        await asyncio.gather(*readers)
        stats = engine.stats
    finally:
        await engine.close()
    request = next(r for r in seen if r.text == NEWCOMER)
    assert request.first_chunk_step is not None
    return request.first_chunk_step - request.arrival_step, audio, stats


async def test_a_newcomers_opening_tokens_come_in_a_burst_not_one_a_step(
    model: CosyVoice3, voices: VoiceStore
) -> None:
    one_a_step, audio_before, _ = await newcomer_steps(model, voices, burst=0)
    bursts, audio_after, stats = await newcomer_steps(model, voices, burst=32)
    assert one_a_step >= 20  # 25 tokens + 3 of look-ahead, one a step, before its first hop could run
    assert bursts <= 2  # admitted, prefilled, its tokens and its opening hop: the step under way at most
    assert stats["decode_bursts"] > 0
    assert audio_after.size == audio_before.size > 0
    assert np.abs(audio_after.astype(np.int32) - audio_before.astype(np.int32)).max() <= 8  # float rounding


def test_a_step_asked_to_yield_leaves_the_short_lane_for_the_next_step(
    model: CosyVoice3, voices: VoiceStore
) -> None:
    backend = make_backend(model, voices, burst=32)
    backend.stepper.bursts_yield = False  # here the request arrives after the burst (the next test: during)
    playing, newcomer = playing_and_newcomer(backend)
    early: list[int] = []
    lanes = StepBudget(lanes=(Lane.SHORT, Lane.URGENT))
    out = backend.step([playing, newcomer], lanes, lambda items: early.extend(i for i, _ in items), lambda: True)
    assert 1 in early and out[0].size == 0  # the newcomer's audio went out; the short hop waited
    assert backend.step_stats()["steps_yielded"] == 1 and playing.next_job() is not None
    out = backend.step([playing, newcomer], lanes, lambda items: early.extend(i for i, _ in items), lambda: False)
    assert 0 in early  # the next step ran it, in the short lane, right after the urgent audio
    for stream in (playing, newcomer):
        stream.close()


def test_a_request_arriving_mid_burst_ends_it_and_the_next_burst_decodes_both(
    model: CosyVoice3, voices: VoiceStore
) -> None:
    """With ``bursts_yield``, a newcomer that arrives during another newcomer's burst does not wait for
    that burst, its opening hop, then a burst of its own: the burst ends between two iterations, and
    the next step's burst decodes both (their audio the same as each alone)."""
    alone = []
    for text in (NEWCOMER, PLAYING[1]):
        backend = make_backend(model, voices, burst=32)
        stream = backend.open_stream(text, "default", 1.0)
        (audio,) = backend.step([stream], StepBudget(lanes=(Lane.URGENT,)))
        assert audio.size  # a burst and the opening hop in one step
        alone.append(audio)
        stream.close()
    backend = make_backend(model, voices, burst=32)
    assert backend.stepper.bursts_yield and not backend.stepper.bursts_split  # a CPU's default (step-order.md)
    first, second = backend.open_stream(NEWCOMER, "default", 1.0), backend.open_stream(PLAYING[1], "default", 1.0)
    calls = iter(range(100))
    arrives = lambda: next(calls) >= 5  # noqa: E731 - true from its sixth call on: during the burst
    (out,) = backend.step([first], StepBudget(lanes=(Lane.URGENT,)), lambda items: None, arrives)
    stats = backend.step_stats()
    assert out.size == 0 and stats["decode_bursts_cut"] == 1 and 0 < stats["decode_bursts"] < 28
    assert len(first.segments[0].llm.out_tokens) < 28  # short of its opening hop's 25 + 3
    early: dict[int, np.ndarray] = {}
    lanes = StepBudget(lanes=(Lane.URGENT, Lane.URGENT))
    backend.step([first, second], lanes, lambda items: early.update(items), lambda: False)
    assert backend.step_stats()["decode_bursts_cut"] == 1 and set(early) == {0, 1}  # both openings went out
    for index, audio in early.items():
        got = np.asarray(audio)
        assert got.shape == alone[index].shape and np.allclose(got, alone[index], atol=1e-4)
    for stream in (first, second):
        stream.close()


def test_with_bursts_split_the_first_opening_does_not_wait_for_the_newcomers_tokens(
    model: CosyVoice3, voices: VoiceStore
) -> None:
    """With ``bursts_split`` too, the burst after the cut ends once the first newcomer has its opening
    tokens: its opening goes out and the step ends, the second newcomer's burst goes on in the next step
    (both openings' audio the same as each alone)."""
    alone = []
    for text in (NEWCOMER, PLAYING[1]):
        backend = make_backend(model, voices, burst=32)
        stream = backend.open_stream(text, "default", 1.0)
        (audio,) = backend.step([stream], StepBudget(lanes=(Lane.URGENT,)))
        alone.append(audio)
        stream.close()
    backend = make_backend(model, voices, burst=32)
    backend.stepper.bursts_split = True  # off by default (docs/step-order.md, item 1)
    first, second = backend.open_stream(NEWCOMER, "default", 1.0), backend.open_stream(PLAYING[1], "default", 1.0)
    calls = iter(range(100))
    arrives = lambda: next(calls) >= 5  # noqa: E731 - true from its sixth call on: during the burst
    (out,) = backend.step([first], StepBudget(lanes=(Lane.URGENT,)), lambda items: None, arrives)
    assert out.size == 0 and backend.step_stats()["decode_bursts_cut"] == 1
    yielded = backend.step_stats()["steps_yielded"]
    handouts: list[tuple[int, np.ndarray]] = []
    urgent = StepBudget(lanes=(Lane.URGENT, Lane.URGENT))
    backend.step([first, second], urgent, lambda items: handouts.extend(items), lambda: False)
    stats = backend.step_stats()
    assert [i for i, _ in handouts] == [0] and stats["decode_bursts_split"] == 1  # the first's opening only
    assert stats["steps_yielded"] == yielded and stats["catch_up_decodes"] == 0  # the step ended after it
    assert len(second.segments[0].llm.out_tokens) < 28  # short of its opening hop's 25 + 3
    later = StepBudget(lanes=(Lane.COMFORTABLE, Lane.URGENT))
    backend.step([first, second], later, lambda items: handouts.extend(items), lambda: False)
    assert [i for i, _ in handouts][:2] == [0, 1]  # the second's opening, in the next step
    for index, audio in handouts[:2]:
        got = np.asarray(audio)
        assert got.shape == alone[index].shape and np.allclose(got, alone[index], atol=1e-4)
    for stream in (first, second):
        stream.close()


def test_after_a_steps_flow_work_the_llms_catch_up(model: CosyVoice3, voices: VoiceStore) -> None:
    """One token a step falls behind real time once steps run flow work: after it, every running LLM gets
    more decode iterations (for up to half the flow work's time), batched."""
    backend = make_backend(model, voices, burst=32)
    playing, other = (backend.open_stream(t, "default", 1.0) for t in PLAYING)
    lanes = StepBudget(lanes=(Lane.URGENT, Lane.COMFORTABLE))
    while not backend.step([playing, other], lanes)[0].size:  # the step that ran playing's opening hop
        pass
    stats = backend.step_stats()
    assert stats["catch_up_decodes"] > 0
    # the comfortable stream, never in a burst, got more than one token a step
    assert len(other.segments[0].llm.out_tokens) >= 1 + stats["catch_up_decodes"]  # its prefill, then each
    for stream in (playing, other):
        stream.close()


def _samples(out: object) -> int:
    assert not isinstance(out, BaseException), out
    return 0 if out is None else int(np.asarray(out).size)


def _until_closing(backend: CosyVoiceBackend, stream: CosyVoiceStream, chunks: list[np.ndarray]) -> None:
    """Step ``stream`` until its next call is its exact closing call, keeping its audio: urgent while a
    hop is ready or its opening waits (the hop runs), else deferred (a token a step, no hop runs), so
    the closing call is ready before a step, not made and run within one."""
    backend.stepper.deferred_after_openings = False  # deferred: tokens only, though nobody waits
    for _ in range(400):
        stream.feed_tokens()
        job = stream.next_job()
        if job is not None and job.finalize:
            assert not job.streaming
            return
        lane = Lane.URGENT if job is not None or stream.awaits_opening else Lane.DEFERRED
        [out] = backend.step([stream], StepBudget(lanes=(lane,)))
        chunks.append(np.asarray(out))
    raise AssertionError("no closing call came")


def _to_end(backend: CosyVoiceBackend, stream: CosyVoiceStream, chunks: list[np.ndarray], lane: Lane) -> None:
    for _ in range(50):
        [out] = backend.step([stream], StepBudget(lanes=(lane,)))
        assert not isinstance(out, BaseException), out
        if out is None:
            return
        chunks.append(np.asarray(out))
    raise AssertionError("the stream did not end")


@pytest.mark.parametrize(("riders", "other_lane"), [(4, Lane.COMFORTABLE), (0, Lane.COMFORTABLE), (4, Lane.BACKGROUND)])
def test_other_running_llms_ride_along_a_newcomers_burst(
    model: CosyVoice3, voices: VoiceStore, riders: int, other_lane: Lane
) -> None:
    """A newcomer's burst decodes up to ``burst_riders`` other running LLMs in the same iterations (their
    tokens are due anyway and a batched row costs a fraction of an iteration of its own); a batch request
    held while someone waits (``BACKGROUND``) never rides. Riders never lengthen the burst, and the
    newcomer's tokens are the same."""
    backend = make_backend(model, voices, burst=32)
    backend.stepper.burst_riders = riders
    backend.stepper._catch_up = lambda *args, **kwargs: None  # type: ignore[method-assign]  # tokens by count
    other, newcomer = (backend.open_stream(t, "default", 1.0) for t in (PLAYING[0], NEWCOMER))
    backend.step([other], StepBudget(lanes=(Lane.URGENT,)))  # its opening hop; its LLM goes on
    before = len(other.segments[0].llm.out_tokens)
    assert other.segments[0].wave.token_offset > 0 and before + 32 < 120  # fixed_llm_tokens: it runs on
    start = backend.step_stats()
    backend.step([newcomer, other], StepBudget(lanes=(Lane.URGENT, other_lane)))
    stats = {key: value - start[key] for key, value in backend.step_stats().items()}
    iterations = stats["decode_bursts"]
    assert iterations >= 20  # the newcomer's 25 tokens + 3 of look-ahead, less its prefill's
    rides = riders > 0 and other_lane != Lane.BACKGROUND
    assert stats["decode_burst_riders"] == (iterations if rides else 0)
    assert stats["decode_burst_rows"] == iterations  # the newcomer alone was short of tokens
    gained = len(other.segments[0].llm.out_tokens) - before  # the step's own decode (unless held), then rides
    assert gained >= iterations if rides else gained <= 1
    alone = make_backend(model, voices, burst=32)
    alone.stepper._catch_up = lambda *args, **kwargs: None  # type: ignore[method-assign]
    solo = alone.open_stream(NEWCOMER, "default", 1.0)
    alone.step([solo], StepBudget(lanes=(Lane.URGENT,)))
    assert solo.segments[0].llm.out_tokens == newcomer.segments[0].llm.out_tokens  # riders change no token
    for stream in (newcomer, other, solo):
        stream.close()


def test_at_most_burst_riders_ride_the_first_in_rank_order(model: CosyVoice3, voices: VoiceStore) -> None:
    """Three other running LLMs, two riders a burst iteration (the default): the first two in rank order
    ride every iteration, the third decodes only the step's own token."""
    backend = make_backend(model, voices, burst=32)
    assert backend.stepper.burst_riders == 2
    backend.stepper._catch_up = lambda *args, **kwargs: None  # type: ignore[method-assign]  # tokens by count
    others = [backend.open_stream(t, "default", 1.0) for t in (PLAYING[0], PLAYING[1], PLAYING[0])]
    for other in others:
        backend.step([other], StepBudget(lanes=(Lane.URGENT,)))  # its opening hop; its LLM goes on
        assert other.segments[0].wave.token_offset > 0
    newcomer = backend.open_stream(NEWCOMER, "default", 1.0)
    before = [len(other.segments[0].llm.out_tokens) for other in others]
    assert max(before) + 32 < 120  # fixed_llm_tokens: each runs on through the burst
    start = backend.step_stats()
    backend.step([newcomer, *others], StepBudget(lanes=(Lane.URGENT,) + (Lane.COMFORTABLE,) * 3, hop_rows=0))
    stats = {key: value - start[key] for key, value in backend.step_stats().items()}
    iterations = stats["decode_bursts"]
    assert iterations >= 20 and stats["decode_burst_riders"] == 2 * iterations
    gained = [len(other.segments[0].llm.out_tokens) - b for other, b in zip(others, before, strict=True)]
    assert min(gained[:2]) >= iterations and gained[2] <= 1
    for stream in (newcomer, *others):
        stream.close()


@pytest.mark.parametrize(("need", "lane"), [(True, Lane.COMFORTABLE), (False, Lane.COMFORTABLE), (True, Lane.SHORT)])
def test_with_riders_need_tokens_a_comfortable_stream_whose_next_hop_is_ready_does_not_ride(
    model: CosyVoice3, voices: VoiceStore, need: bool, lane: Lane
) -> None:
    """With ``riders_need_tokens`` a stream with a comfortable lead whose next hop already has its tokens
    does not ride along a newcomer's burst, and one still short of them does; a short (or urgent) stream
    rides either way, as every stream with a running LLM does without it."""
    backend = make_backend(model, voices, burst=32)
    backend.stepper.riders_need_tokens = need
    backend.stepper._catch_up = lambda *args, **kwargs: None  # type: ignore[method-assign]  # tokens by count
    ready, newcomer = playing_and_newcomer(backend)  # its next hop's tokens are there, its LLM runs on
    streams, lanes = [newcomer, ready], [Lane.URGENT, lane]
    if lane == Lane.COMFORTABLE:  # and a comfortable one still short of its next hop's tokens
        short = backend.open_stream(PLAYING[1], "default", 1.0)
        while not backend.step([short], StepBudget(lanes=(Lane.URGENT,)))[0].size:  # its opening hop
            pass
        short.feed_tokens()
        assert short.next_job() is None and short.llm_request() is not None
        streams.append(short)
        lanes.append(lane)
    start = backend.step_stats()
    backend.step(streams, StepBudget(lanes=tuple(lanes), hop_rows=0))  # the LLM and its burst, no flow call
    stats = {key: value - start[key] for key, value in backend.step_stats().items()}
    iterations = stats["decode_bursts"]
    assert iterations >= 20  # the newcomer's 25 tokens + 3 of look-ahead, less its prefill's
    assert stats["decode_burst_rows"] == iterations  # the newcomer alone was a burst row
    ready_rides = not need or lane == Lane.SHORT
    assert stats["decode_burst_riders"] == iterations * (len(streams) - 2 + ready_rides)
    for stream in streams:
        stream.close()

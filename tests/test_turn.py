"""A Turn built from plain parts (fake engine, scripted LLM, a list as the socket): the order of what it sends."""

from __future__ import annotations

import asyncio
import dataclasses

from gateway.config import Config
from gateway.llm.tool_calls import ToolCall
from gateway.speech.phrases import Phrases
from gateway.speech.reply import Emotion, Reply
from gateway.speech.segmenter import SentenceSegmenter
from gateway.speech.turn import Turn, TurnRecorder, turn_config
from gateway.tools.runner import ToolLoopSettings
from gateway.tools.toolset import ToolSet
from gateway.xiaozhi import AudioOut, LlmEmotion, TtsStop
from tests.turn_fakes import FAST, RATE, FakeEngine, FakeStream, ScriptedLLM, SlowTool, names, sentences
from tts_engine.errors import EngineUnavailable

FIRST = "今天的天气很好阳光明媚。"
SECOND = "明天也是一个好天气。"


def make_turn(llm: ScriptedLLM, engine: FakeEngine | None = None, **kwargs) -> tuple[Turn, list[object]]:
    sent: list[object] = []

    async def send(message: object) -> None:
        sent.append(message)

    turn = Turn(
        engine=engine or FakeEngine(), llm=llm, send=send, config=kwargs.pop("config", FAST), **kwargs
    )
    return turn, sent


async def test_an_answer_sends_emotion_before_its_sentences_and_audio_between_start_and_stop() -> None:
    first_audio: list[float] = []
    llm = ScriptedLLM(["😆", FIRST[:5], FIRST[5:], SECOND])
    turn, sent = make_turn(llm, recorder=TurnRecorder(first_audio=first_audio.append))
    await asyncio.wait_for(turn.answer("天气怎么样", [{"role": "user", "content": "天气怎么样"}]), 10)

    assert names(sent) == [
        "stt",
        "tts start",
        "emotion",
        "sentence",
        "audio",
        "sentence",
        "audio",
        "tts stop",
    ]
    assert sent[2] == LlmEmotion(emotion="laughing", text="😆")
    assert sentences(sent) == [FIRST, SECOND]
    assert sum(isinstance(m, AudioOut) for m in sent) == 8  # 2 sentences x 240 ms in 60 ms frames
    assert turn.answer_text == "😆" + FIRST + SECOND
    assert turn.first_audio_s is not None and first_audio == [turn.first_audio_s]


async def test_no_emotion_when_the_device_turned_it_off() -> None:
    turn, sent = make_turn(ScriptedLLM([FIRST]), emotion=False)
    await asyncio.wait_for(turn.answer("q", [{"role": "user", "content": "q"}]), 10)
    assert names(sent) == ["stt", "tts start", "sentence", "audio", "tts stop"]


async def test_fixed_sentences_after_an_stt_echo() -> None:
    turn, sent = make_turn(ScriptedLLM())
    await asyncio.wait_for(turn.say(["你好，我在。"], stt="小智"), 10)
    assert names(sent) == ["stt", "tts start", "sentence", "audio", "tts stop"]
    assert sentences(sent) == ["你好，我在。"] and turn.answer_text == ""


async def test_abort_mid_sentence_ends_with_one_tts_stop_and_no_audio_after_it() -> None:
    engine = FakeEngine(hang=(SECOND,))  # the second sentence gives one chunk, then nothing
    turn, sent = make_turn(ScriptedLLM([FIRST, SECOND]), engine)
    task = asyncio.create_task(turn.answer("q", [{"role": "user", "content": "q"}]))
    async with asyncio.timeout(10):
        while sentences(sent) != [FIRST, SECOND] or not isinstance(sent[-1], AudioOut):
            await asyncio.sleep(0.01)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)

    assert isinstance(sent[-1], TtsStop)
    assert sum(isinstance(m, TtsStop) for m in sent) == 1
    assert turn.answer_text == FIRST + SECOND  # what it got so far, for the history


async def test_a_failed_llm_gives_a_sad_face_and_the_apology() -> None:
    failures: list[None] = []
    turn, sent = make_turn(
        ScriptedLLM(fail=True), recorder=TurnRecorder(llm_failed=lambda: failures.append(None))
    )
    await asyncio.wait_for(turn.answer("q", [{"role": "user", "content": "q"}]), 10)
    assert names(sent) == ["stt", "tts start", "emotion", "sentence", "audio", "tts stop"]
    assert sent[2] == LlmEmotion(emotion="sad", text="😔")
    assert sentences(sent) == [FAST.apology] and failures == [None]


async def test_a_sentence_lost_with_its_engine_worker_ends_the_reply_with_the_apology() -> None:
    # issue 23: the reply ends with the apology; nothing of it is spoken after (it used to go on)
    failed: list[None] = []
    engine = FakeEngine(fail=(FIRST,))
    recorder = TurnRecorder(sentence_failed=lambda: failed.append(None))
    turn, sent = make_turn(ScriptedLLM([FIRST, SECOND]), engine, emotion=False, recorder=recorder)
    await asyncio.wait_for(turn.answer("q", [{"role": "user", "content": "q"}]), 10)
    assert sentences(sent) == [FAST.apology]
    assert names(sent) == ["stt", "tts start", "sentence", "audio", "tts stop"]
    assert failed == [None] and turn.result is not None and turn.result.failed_sentences == 1


class DownEngine(FakeEngine):
    """No worker is ready: every request is refused at once (what EngineClient does then)."""

    def synthesize(self, text: str, **kwargs: object) -> FakeStream:  # type: ignore[override]
        self.texts.append(text)
        raise EngineUnavailable("no engine worker is ready (unix:w0: restarting)")


async def stored_phrases(*texts: str) -> Phrases:
    phrases = Phrases(texts, output_rate=RATE, voice="default")
    await phrases.prepare(FakeEngine())
    assert phrases.missing == []
    return phrases


async def test_a_turn_while_no_engine_is_ready_plays_the_stored_apology() -> None:
    # issue 23: such turns were `tts start` + `tts stop` with nothing in between (silent)
    phrases = await stored_phrases(FAST.apology)
    engine = DownEngine()
    turn, sent = make_turn(ScriptedLLM([FIRST, SECOND]), engine, emotion=False, phrases=phrases)
    await asyncio.wait_for(turn.answer("q", [{"role": "user", "content": "q"}]), 10)
    assert names(sent) == ["stt", "tts start", "sentence", "audio", "tts stop"]
    assert sentences(sent) == [FAST.apology]
    assert engine.texts == [FIRST]  # refused once; the apology is stored; nothing of the reply after it
    assert sum(isinstance(m, AudioOut) for m in sent) == 4  # the stored 240 ms
    assert turn.result is not None and turn.result.failed_sentences == 1


async def test_without_stored_audio_the_apology_text_still_reaches_the_device() -> None:
    turn, sent = make_turn(ScriptedLLM([FIRST]), DownEngine(), emotion=False)
    await asyncio.wait_for(turn.answer("q", [{"role": "user", "content": "q"}]), 10)
    assert names(sent) == ["stt", "tts start", "sentence", "tts stop"]
    assert sentences(sent) == [FAST.apology]


async def test_fixed_phrases_are_played_from_the_store_in_their_voice_only() -> None:
    phrases = await stored_phrases("请稍等。")
    engine = FakeEngine()
    turn, sent = make_turn(ScriptedLLM(["请稍等。", FIRST]), engine, emotion=False, phrases=phrases)
    await asyncio.wait_for(turn.answer("q", [{"role": "user", "content": "q"}]), 10)
    assert sentences(sent) == ["请稍等。", FIRST] and engine.texts == [FIRST]
    other = FakeEngine()
    turn, sent = make_turn(ScriptedLLM(["请稍等。"]), other, emotion=False, phrases=phrases, voice="other")
    await asyncio.wait_for(turn.answer("q", [{"role": "user", "content": "q"}]), 10)
    assert sentences(sent) == ["请稍等。"] and other.texts == ["请稍等。"]  # another voice: synthesised


async def test_a_slow_tool_call_gets_its_filler_before_the_answer() -> None:
    tool = SlowTool(delay_s=0.3)
    tools = await ToolSet.gather([tool])
    llm = ScriptedLLM([[ToolCall("c1", "weather", "{}")]], [FIRST])
    config = dataclasses.replace(FAST, tools=ToolLoopSettings(filler_after_s=0.05, filler="请稍等。"))
    turn, sent = make_turn(llm, config=config, tools=tools)
    await asyncio.wait_for(turn.answer("天气", [{"role": "user", "content": "天气"}]), 10)

    assert sentences(sent) == ["请稍等。", FIRST]
    assert names(sent)[-1] == "tts stop" and names(sent)[:2] == ["stt", "tts start"]
    assert tool.calls == [("weather", {})]
    assert llm.requests[1][-1]["role"] == "tool" and "25" in llm.requests[1][-1]["content"]
    assert turn.answer_text == FIRST  # the filler is no part of the answer


async def test_tools_gathered_by_the_turn_come_after_the_stt_echo() -> None:
    sent_when_gathered: list[list[str]] = []

    async def gather() -> ToolSet:
        sent_when_gathered.append(names(sent))
        return await ToolSet.gather([SlowTool(0)])

    turn, sent = make_turn(ScriptedLLM([FIRST]), tools=gather)
    await asyncio.wait_for(turn.answer("q", [{"role": "user", "content": "q"}]), 10)
    assert sent_when_gathered == [["stt"]]


async def test_the_reply_yields_its_emotion_once_before_the_first_sentence() -> None:
    reply = Reply(
        llm=ScriptedLLM(["", "  ", "好的", "，没问题。😳再见。"]),
        messages=[{"role": "user", "content": "q"}],
        segmenter=SentenceSegmenter(),
        apology="抱歉。",
    )
    events = [event async for event in reply.events()]
    assert events[0] == Emotion(emotion="happy", emoji="🙂")  # no emoji in the first words: the default
    assert all(isinstance(e, str) for e in events[1:])  # one emotion, though a later one had an emoji
    assert "".join(events[1:]) == "好的，没问题。再见。" and "😳" in reply.text


def test_turn_config_is_read_from_the_config() -> None:
    config = Config.model_validate(
        {"audio": {"output_sample_rate": 24000, "opus_complexity": 3}, "tts": {"voice": "x"},
         "llm": {"tool_filler": "等等。", "max_tool_rounds": 2}, "segmenter": {"max_chars": 50}}
    )  # fmt: skip
    cfg = turn_config(config)
    assert (cfg.sample_rate, cfg.opus_complexity, cfg.voice, cfg.max_segment_chars) == (24000, 3, "x", 50)
    assert (cfg.tools.filler, cfg.tools.max_rounds) == ("等等。", 2)

"""Loopback integration of the protocol checklist's turns (no ASR): replies, LLM failures, abort, barge-in."""

from __future__ import annotations

import asyncio

from gateway.llm.base import LLMError
from gateway.xiaozhi import AudioOut, LlmEmotion, ServerHello, Stt, TtsSentenceStart, TtsStart, TtsStop
from tests.device_loopback import connected, fake
from tests.gateway_server import running_gateway


class ScriptedLLM:
    """Streams fixed deltas; records the messages it was given."""

    def __init__(self, deltas: list[str], delay_s: float = 0.0, fail: bool = False) -> None:
        self.deltas = deltas
        self.delay_s = delay_s
        self.fail = fail
        self.calls: list[list[dict[str, str]]] = []

    async def stream_chat(self, messages):
        self.calls.append(messages)
        for delta in self.deltas:
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            yield delta
        if self.fail:
            raise LLMError("upstream went away")


# ---- turns (10, 14-21) --------------------------------------------------------------


async def test_nothing_is_spoken_before_the_first_listen_message():
    async with running_gateway(backend=fake()) as gw:
        sim = await connected(gw)
        await asyncio.sleep(0.5)
        assert [type(r.event) for r in sim.records] == [ServerHello]
        await sim.close()


async def test_wake_word_gives_a_greeting_turn_without_stt():
    async with running_gateway(backend=fake()) as gw:
        sim = await connected(gw)
        await sim.listen_start("auto")
        turn = await sim.ask("你好小智！")
        await sim.close()
    kinds = [type(e) for e in turn.events if not isinstance(e, AudioOut)]
    assert kinds == [TtsStart, TtsSentenceStart, TtsStop]
    assert turn.sentences == [gw.services.config.session.greeting]
    assert len(turn.frames) > 0


async def test_wake_word_without_greeting():
    async with running_gateway({"session": {"enable_greeting": False}}, backend=fake()) as gw:
        sim = await connected(gw)
        turn = await sim.ask("你好小智")
        await sim.close()
    assert [type(e) for e in turn.events] == [Stt, TtsStart, TtsStop]


async def test_emotion_first_and_clean_subtitles():
    llm = ScriptedLLM(["😆 今天", "天气**很好**，", "我们去\n公园玩吧！🎉 ", "Have fun."])
    async with running_gateway(backend=fake(), llm=llm) as gw:
        sim = await connected(gw)
        turn = await sim.ask("天气怎么样")
        await sim.close()
    emotions = [e for e in turn.events if isinstance(e, LlmEmotion)]
    assert len(emotions) == 1 and emotions[0].emotion == "laughing"
    first_sentence = next(i for i, e in enumerate(turn.events) if isinstance(e, TtsSentenceStart))
    assert turn.events.index(emotions[0]) < first_sentence
    assert turn.sentences and all("\n" not in s and "*" not in s for s in turn.sentences)
    joined = "".join(turn.sentences)
    assert "😆" not in joined and "🎉" not in joined and "今天天气很好" in joined
    # the first segment may end at a comma (fast first audio)
    assert turn.sentences[0].endswith("，")
    assert llm.calls[0][-1] == {"role": "user", "content": "天气怎么样"}


async def test_history_is_kept_per_session():
    llm = ScriptedLLM(["好的。"])
    async with running_gateway(backend=fake(), llm=llm) as gw:
        a = await connected(gw)
        b = await connected(gw)
        await a.ask("first question")
        await a.ask("second question")
        await b.ask("other device")
        await a.close()
        await b.close()
    assert [m["content"] for m in llm.calls[1] if m["role"] != "system"] == [
        "first question",
        "好的。",
        "second question",
    ]
    assert [m["content"] for m in llm.calls[2] if m["role"] != "system"] == ["other device"]


async def test_llm_failure_becomes_a_spoken_apology():
    llm = ScriptedLLM([], fail=True)
    async with running_gateway(backend=fake(), llm=llm) as gw:
        sim = await connected(gw)
        turn = await sim.ask("hello?")
        llm.fail = False
        llm.deltas = ["Fine again."]
        again = await sim.ask("hello again?")
        await sim.close()
    assert turn.sentences == [gw.services.config.llm.apology]
    assert len(turn.frames) > 0 and isinstance(turn.events[-1], TtsStop)
    assert again.sentences == ["Fine again."]


async def test_a_failing_sentence_ends_the_reply_with_the_apology():
    # issue 23: the reply ends with the apology (it used to skip the sentence and go on after it)
    llm = ScriptedLLM(["First sentence. ", "This one will BOOM here. ", "Last one."])
    async with running_gateway(backend=fake(fail_on="BOOM"), llm=llm) as gw:
        sim = await connected(gw)
        turn = await sim.ask("go")
        await sim.close()
        apology = gw.services.config.llm.apology
    assert turn.sentences == ["First sentence.", apology]
    assert isinstance(turn.events[-1], TtsStop)


# ---- abort and barge-in by a new query (27, 28) -----------------------------------------


async def test_abort_stops_at_once_and_nothing_of_the_turn_follows():
    llm = ScriptedLLM(["This is a long answer that keeps going for a while. " * 4])
    async with running_gateway(backend=fake(), llm=llm) as gw:
        sim = await connected(gw)
        t_query = await sim.detect("talk to me")
        await sim.next_event(AudioOut, timeout=5)
        t_abort = await sim.abort()
        stop = await sim.next_event(TtsStop, timeout=1)
        assert stop.t - t_abort < 0.3  # a sentence of the reply lasts about 1 s
        await asyncio.sleep(0.8)
        late = [r for r in sim.records if r.t > stop.t]
        assert not [r for r in late if isinstance(r.event, AudioOut | TtsSentenceStart)]
        stops = [r for r in sim.records if isinstance(r.event, TtsStop)]
        assert len(stops) == 1
        # abort with nothing playing still answers tts stop
        t_abort = await sim.abort("wake_word_detected")
        idle_stop = await sim.next_event(TtsStop, timeout=1)
        assert idle_stop.t - t_abort < 0.3
        assert t_query < t_abort
        await sim.close()
        await asyncio.sleep(0.1)
        assert gw.services.engine.health()["live_requests"] == 0


async def test_new_query_while_speaking_aborts_the_old_turn_first():
    llm = ScriptedLLM(["A long first answer that takes time to say. " * 3])
    async with running_gateway(backend=fake(), llm=llm) as gw:
        sim = await connected(gw)
        await sim.detect("first")
        await sim.next_event(AudioOut, timeout=5)
        llm.deltas = ["Second."]
        t_query = await sim.detect("second")
        old_end = await sim.collect_turn(t_query)
        turn2 = await sim.collect_turn(t_query)
        await sim.close()
    # the old turn's stop comes first, nothing of it after, then the new turn in order
    assert not [e for e in old_end.events if not isinstance(e, AudioOut | TtsStop)]
    kinds = [type(e) for e in turn2.events if not isinstance(e, AudioOut)]
    assert kinds == [Stt, TtsStart, LlmEmotion, TtsSentenceStart, TtsStop]
    assert turn2.stt == "second" and turn2.sentences == ["Second."]

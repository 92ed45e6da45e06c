import pytest

from gateway.llm import ChatLLM, EchoLLM


async def collect(llm: EchoLLM, messages) -> list[str]:
    return [delta async for delta in llm.stream_chat(messages)]


async def test_chinese_user_gets_chinese_prefix_in_several_deltas():
    llm = EchoLLM()
    assert isinstance(llm, ChatLLM)
    deltas = await collect(llm, [{"role": "user", "content": "今天天气怎么样"}])
    assert "".join(deltas) == "你说的是：今天天气怎么样"
    assert len(deltas) > 1 and all(deltas)


async def test_other_language_gets_english_prefix():
    deltas = await collect(EchoLLM(), [{"role": "user", "content": " hello there "}])
    assert "".join(deltas) == "You said: hello there"


async def test_answers_the_last_user_message():
    messages = [
        {"role": "system", "content": "系统提示"},
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "You said: first"},
        {"role": "user", "content": "second"},
    ]
    assert "".join(await collect(EchoLLM(), messages)) == "You said: second"


async def test_prefixes_and_delta_size_are_configurable():
    llm = EchoLLM(chinese_prefix="复述：", prefix="", delta_chars=1)
    assert await collect(llm, [{"role": "user", "content": "你好"}]) == ["复", "述", "：", "你", "好"]
    assert await collect(llm, [{"role": "user", "content": "hi"}]) == ["h", "i"]


async def test_no_user_text_gives_no_answer():
    assert await collect(EchoLLM(), [{"role": "system", "content": "only a prompt"}]) == []
    assert await collect(EchoLLM(), [{"role": "user", "content": "   "}]) == []


async def test_bad_input_raises_value_error():
    with pytest.raises(ValueError):
        await collect(EchoLLM(), [])
    with pytest.raises(ValueError):
        EchoLLM(delta_chars=0)

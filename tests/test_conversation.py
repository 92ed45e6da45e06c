import pytest

from gateway.llm import Conversation


def test_first_turn_is_system_then_user():
    conversation = Conversation("你是小智。")
    assert conversation.messages_for("你好") == [
        {"role": "system", "content": "你是小智。"},
        {"role": "user", "content": "你好"},
    ]


def test_history_sits_between_system_and_new_user_message():
    conversation = Conversation("prompt")
    conversation.add_turn("hi", "hello!")
    conversation.add_turn("how are you", "fine.")
    assert conversation.messages_for("bye") == [
        {"role": "system", "content": "prompt"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello!"},
        {"role": "user", "content": "how are you"},
        {"role": "assistant", "content": "fine."},
        {"role": "user", "content": "bye"},
    ]


def test_messages_for_does_not_change_history():
    conversation = Conversation("prompt")
    conversation.messages_for("not answered")
    assert conversation.turns == ()
    messages = conversation.messages_for("again")
    messages.clear()
    assert len(conversation.messages_for("again")) == 2


def test_history_keeps_only_the_last_max_turns():
    conversation = Conversation("p", max_turns=2)
    for index in range(5):
        conversation.add_turn(f"q{index}", f"a{index}")
    assert conversation.turns == (("q3", "a3"), ("q4", "a4"))
    contents = [m["content"] for m in conversation.messages_for("next")]
    assert contents == ["p", "q3", "a3", "q4", "a4", "next"]


def test_max_turns_zero_keeps_no_history():
    conversation = Conversation("p", max_turns=0)
    conversation.add_turn("q", "a")
    assert conversation.messages_for("x") == [
        {"role": "system", "content": "p"},
        {"role": "user", "content": "x"},
    ]


def test_partial_answer_is_stored_and_unspoken_answer_is_not():
    conversation = Conversation("p")
    conversation.add_turn("讲个故事", "从前有座山，")  # interrupted after the first sentence
    conversation.add_turn("算了", "  ")  # interrupted before anything was spoken
    assert conversation.turns == (("讲个故事", "从前有座山，"),)
    roles = [m["role"] for m in conversation.messages_for("好吧")]
    assert roles == ["system", "user", "assistant", "user"]


def test_empty_system_prompt_is_left_out():
    assert Conversation("  ").messages_for("hi") == [{"role": "user", "content": "hi"}]


def test_clear_forgets_history_but_keeps_prompt():
    conversation = Conversation("p")
    conversation.add_turn("q", "a")
    conversation.clear()
    assert conversation.turns == ()
    assert conversation.messages_for("x")[0] == {"role": "system", "content": "p"}


def test_bad_input_raises():
    with pytest.raises(ValueError):
        Conversation("p", max_turns=-1)
    with pytest.raises(ValueError):
        Conversation("p").messages_for("   ")
    with pytest.raises(ValueError):
        Conversation("p").add_turn("", "a")
    with pytest.raises(TypeError):
        Conversation("p").add_turn("q", None)  # type: ignore[arg-type]

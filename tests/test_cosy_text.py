import pytest

from cosyvoice.text.prompt import (
    INSTRUCT_PREFIX,
    PROMPT_PREFIX,
    LLMTextInput,
    PromptMode,
    TextError,
    build_llm_text,
    cross_lingual_text,
    instruct_prompt,
    is_only_punctuation,
    normalize_text,
    prepare_tts_texts,
    split_paragraph,
    zero_shot_prompt,
)

ENDOFPROMPT_ID = 100000


class CharEncoder:
    """One id per character; ``<|endofprompt|>`` is a single special id (like the real tokenizer)."""

    def __init__(self, knows_special: bool = True) -> None:
        self.knows_special = knows_special

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        for i, piece in enumerate(text.split("<|endofprompt|>")):
            if i and self.knows_special:
                ids.append(ENDOFPROMPT_ID)
            elif i:
                ids.extend(ord(c) for c in "<|endofprompt|>")
            ids.extend(ord(c) for c in piece)
        return ids


def words(text: str) -> list[int]:
    return [len(word) for word in text.split()]


def test_prompt_strings() -> None:
    assert zero_shot_prompt("你好。") == "You are a helpful assistant.<|endofprompt|>你好。"
    assert zero_shot_prompt("custom<|endofprompt|>x") == "custom<|endofprompt|>x"
    assert (
        instruct_prompt("请用广东话表达。") == "You are a helpful assistant. 请用广东话表达。<|endofprompt|>"
    )
    assert cross_lingual_text("[breath]你好") == "You are a helpful assistant.<|endofprompt|>[breath]你好"
    assert PROMPT_PREFIX + " " == INSTRUCT_PREFIX


def test_zero_shot_layout() -> None:
    encoder = CharEncoder()
    out = build_llm_text(encoder, PromptMode.ZERO_SHOT, "今天", transcript="希望")
    assert out == LLMTextInput(
        prompt_text_ids=tuple(encoder.encode(PROMPT_PREFIX + "<|endofprompt|>希望")),
        text_ids=tuple(encoder.encode("今天")),
        use_prompt_speech=True,
    )
    assert ENDOFPROMPT_ID in out.prompt_text_ids


def test_instruct_and_cross_lingual_layouts() -> None:
    encoder = CharEncoder()
    instruct = build_llm_text(encoder, "instruct", "今天", instruction="请用四川话说。")
    assert instruct.prompt_text_ids[-1] == ENDOFPROMPT_ID and not instruct.use_prompt_speech
    assert instruct.text_ids == tuple(encoder.encode("今天"))
    cross = build_llm_text(encoder, PromptMode.CROSS_LINGUAL, "hello")
    assert cross.prompt_text_ids == () and not cross.use_prompt_speech
    assert cross.text_ids == tuple(encoder.encode(PROMPT_PREFIX + "<|endofprompt|>hello"))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"mode": PromptMode.ZERO_SHOT, "text": "x"}, "transcript"),
        ({"mode": PromptMode.INSTRUCT, "text": "x"}, "instruction"),
        ({"mode": PromptMode.INSTRUCT, "text": "x", "instruction": "  "}, "instruction must not be empty"),
        ({"mode": PromptMode.CROSS_LINGUAL, "text": ""}, "text must not be empty"),
        ({"mode": "sft", "text": "x"}, "unknown prompt mode 'sft'"),
    ],
)
def test_bad_prompt_arguments(kwargs: dict, message: str) -> None:
    with pytest.raises(TextError, match=message):
        build_llm_text(CharEncoder(), **kwargs)


def test_missing_endofprompt_id_is_an_error() -> None:
    with pytest.raises(TextError, match="must contain <\\|endofprompt\\|>"):
        build_llm_text(CharEncoder(knows_special=False), PromptMode.CROSS_LINGUAL, "hello")


def test_markup_texts_are_not_normalised_or_split() -> None:
    text = "You are a helpful assistant.<|endofprompt|>我有3个苹果。你呢？"
    assert normalize_text(text) == text
    assert prepare_tts_texts(text, CharEncoder().encode) == [text]
    assert prepare_tts_texts("", CharEncoder().encode) == [""]


def test_chinese_normalisation_steps() -> None:
    assert normalize_text(" 我有 3 个苹果\n和2.5个梨， ") == "我有三个苹果和二点五个梨。"
    assert normalize_text("面积10m² （约）【注】") == "面积十m平方约注"
    assert normalize_text("你好 world hello 中文") == "你好world hello中文"
    assert (
        normalize_text("北京 - 上海") == "北京-上海"
    )  # blanks go first, so " - " only survives between ASCII
    assert normalize_text("中文 A - B") == "中文A，B"
    assert normalize_text("结束——开始") == "结束 开始"


def test_english_normalisation_spells_numbers() -> None:
    assert normalize_text("  I have 2 cats.  ") == "I have two cats."


def test_split_zh_packs_sentences_by_characters() -> None:
    sentence = "这是一个用来测试的句子，长度二十个字左右。"  # 21 characters
    segments = split_paragraph(sentence * 8, lang="zh", encode=CharEncoder().encode)
    assert "".join(segments) == sentence * 8
    # a piece is cut once it holds more than 60 characters and the next sentence would pass 80
    assert [len(s) for s in segments] == [63, 63, 42]


def test_split_en_counts_tokens_and_merges_a_short_tail() -> None:
    segments = split_paragraph("a b. c d. e", lang="en", encode=words, max_len=3, min_len=1, merge_len=2)
    assert segments == ["a b.", " c d. e."]


def test_split_keeps_closing_quotes_and_adds_final_punctuation() -> None:
    segments = split_paragraph(
        "他说：“好。”然后走了", lang="zh", encode=CharEncoder().encode, max_len=2, min_len=1, merge_len=1
    )
    assert segments == ["他说：", "“好。”", "然后走了。"]


def test_runs_of_sentence_ends_keep_only_the_first_mark() -> None:
    assert prepare_tts_texts("Hello there. !!! ...", words) == ["Hello there. ! ."]


def test_prepare_tts_texts_drops_punctuation_only_segments() -> None:
    body = "这是一个很长的句子" * 7 + "好了。"  # 66 characters
    punctuation = "，" * 25 + "。"  # a 26-character segment of punctuation only
    assert prepare_tts_texts(body + punctuation, CharEncoder().encode) == [body]
    assert is_only_punctuation("。！…") and is_only_punctuation("")
    assert not is_only_punctuation("a.") and not is_only_punctuation(" 。")


def test_prepare_tts_texts_bounds_english_segments_in_tokens() -> None:
    long_text = "Sentence number one is here. " * 30
    segments = prepare_tts_texts(long_text, words)
    assert len(segments) > 1
    assert all(len(s.split()) <= 80 for s in segments)
    assert " ".join(s.strip() for s in segments) == long_text.strip()

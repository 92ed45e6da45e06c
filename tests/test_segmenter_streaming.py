"""SentenceSegmenter fed as a stream: when segments are released, turns (flush, clear), limits, bad input."""

import pytest

from gateway.speech.segmenter import SentenceSegmenter
from tests.segmenter_helpers import segment_whole


def test_segment_is_released_once_next_character_arrives():
    segmenter = SentenceSegmenter()
    assert segmenter.push("你好，我是小智。") == []
    assert segmenter.push("今") == ["你好，我是小智。"]
    assert segmenter.pending_text == "今"


def test_price_is_not_cut_before_decimals_arrive():
    segmenter = SentenceSegmenter()
    assert segmenter.push("It costs $29.") == []
    assert segmenter.push("99") == []
    assert segmenter.push(" now. And") == ["It costs $29.99 now."]
    assert segmenter.flush() == ["And"]


def test_period_waits_for_next_visible_character():
    segmenter = SentenceSegmenter()
    assert segmenter.push("Mix well.   ") == []
    assert segmenter.push("T") == ["Mix well."]


def test_comma_allowed_only_for_first_segment_of_each_turn():
    segmenter = SentenceSegmenter()
    assert segmenter.push("好的好的，没问题。那么，我们") == ["好的好的，", "没问题。"]
    assert segmenter.flush() == ["那么，我们"]
    # flush() ended the turn: the next turn's first segment may end at a comma again
    assert segmenter.push("没问题的，稍") == ["没问题的，"]


def test_dropped_segment_does_not_count_as_first():
    segmenter = SentenceSegmenter()
    assert segmenter.push("😊\n好的好的，稍等") == ["好的好的，"]


def test_clear_discards_pending_text_and_starts_new_turn():
    segmenter = SentenceSegmenter()
    assert segmenter.push("第一句话说完了。第二句") == ["第一句话说完了。"]
    segmenter.clear()
    assert segmenter.pending_text == ""
    assert segmenter.push("新的回答开始，然后") == ["新的回答开始，"]
    assert segmenter.flush() == ["然后"]


def test_flush_on_empty_segmenter():
    segmenter = SentenceSegmenter()
    assert segmenter.flush() == []
    assert segmenter.push("") == []
    assert segmenter.flush() == []


def test_no_segment_longer_than_max_chars():
    text = ("这是一段很长的文字没有任何标点符号" * 8) + " and some English words without stops " * 5
    for max_chars in (7, 20, 50):
        segments = segment_whole(text, {"max_chars": max_chars})
        assert all(len(segment) <= max_chars for segment in segments)
        assert "".join(segments).replace(" ", "") == text.replace(" ", "")


def test_code_span_is_never_split_inside():
    text = "先运行 `a = 1; b = 2. print(a)` 然后看结果。"
    assert segment_whole(text, {}) == ["先运行 a = 1; b = 2. print(a) 然后看结果。"]


@pytest.mark.parametrize("kwargs", [{"max_chars": 1}, {"max_chars": 0}, {"min_first_chars": -1}])
def test_bad_arguments_raise_value_error(kwargs):
    with pytest.raises(ValueError):
        SentenceSegmenter(**kwargs)


def test_push_rejects_non_text():
    with pytest.raises(TypeError):
        SentenceSegmenter().push(b"bytes")  # type: ignore[arg-type]

"""SentenceSegmenter in linear time: pathological runs of 100k characters cost well under a second of CPU."""

import time

import pytest

from gateway.speech.segmenter import SentenceSegmenter

# ---- linear time -------------------------------------------------------------------------------

# A device's typed text comes back through the echo LLM into the segmenter: 100k characters of each
# pattern must cost well under a second of CPU however they arrive (it was quadratic: 60,000 "."
# took ~24 s in 4-character deltas).
CPU_BUDGET_S = 1.0
PATHOLOGICAL = {
    "dots": "." * 100_000,
    "backticks": "`" * 100_000,
    "cjk-full-stops": "。" * 100_000,
    "exclamations": "！" * 100_000,
    "dots-and-spaces": ". " * 50_000,
    "ellipses-and-spaces": "... " * 25_000,
    "no-punctuation": "a" * 100_000,
    "words-no-punctuation": "word " * 20_000,
    "commas": "，" * 100_000,
    "period-then-spaces": "Hi." + " " * 100_000 + "x",
    "closers": "。" + "）" * 100_000,
    "open-code-span": "`" + "a. b. " * 16_000,
    "mixed-runs": "`..。。 ``" * 10_000,
}


@pytest.mark.parametrize("delta_chars", [None, 5], ids=["one-chunk", "5-char-deltas"])
@pytest.mark.parametrize("name", PATHOLOGICAL)
def test_pathological_text_is_segmented_in_linear_time(name, delta_chars):
    text = "You said: " + PATHOLOGICAL[name]
    step = delta_chars or len(text)
    segmenter = SentenceSegmenter()
    segments: list[str] = []
    start = time.process_time()
    for index in range(0, len(text), step):
        segments += segmenter.push(text[index : index + step])
        assert time.process_time() - start < CPU_BUDGET_S, f"over budget after {index} of {len(text)} chars"
    segments += segmenter.flush()
    assert time.process_time() - start < CPU_BUDGET_S
    assert segments[0] == "You said:"
    assert all(len(segment) <= 120 for segment in segments)
    assert len(segmenter.pending_text) == 0


def test_pending_text_stays_short_while_a_run_streams_in():
    segmenter = SentenceSegmenter(max_chars=50)
    for _ in range(10_000):
        segmenter.push("...")
        assert len(segmenter.pending_text) <= 50 + 3

"""The engine refuses text it cannot hand to a backend, before any backend sees it."""

from __future__ import annotations

import re

import pytest

from tts_engine.arguments import check_arguments, check_instruct


@pytest.mark.parametrize(
    ("text", "where"), [("\ud800 hi", "U+D800 at position 0"), ("ok \udfff", "U+DFFF at position 3")]
)
def test_lone_surrogate_in_text_is_a_value_error(text, where):
    # CosyVoice's tokenizer raised TypeError for it (a 500), espeak-ng got it replaced
    with pytest.raises(ValueError, match=re.escape(f"text is not valid Unicode: lone surrogate {where}")):
        check_arguments(text, 16000, 1.0)


def test_lone_surrogate_in_instruct_is_a_value_error():
    with pytest.raises(ValueError, match="instruct is not valid Unicode"):
        check_instruct("calm \ud801")


def test_valid_text_passes():
    check_arguments("你好 😀 hi", 16000, 1.0)
    assert check_instruct(" calm ") == "calm"

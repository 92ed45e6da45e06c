"""Emotion names and emoji (docs/xiaozhi-protocol.md section 4.5)."""

import pytest

from gateway.xiaozhi.emotions import DEFAULT_EMOTION, EMOTIONS, emotion_for_emoji, find_emotion, is_emotion

# The table of section 4.5, as code points.
PROTOCOL_TABLE = {
    "neutral": 0x1F636,
    "happy": 0x1F642,
    "laughing": 0x1F606,
    "funny": 0x1F602,
    "sad": 0x1F614,
    "angry": 0x1F620,
    "crying": 0x1F62D,
    "loving": 0x1F60D,
    "embarrassed": 0x1F633,
    "surprised": 0x1F62F,
    "shocked": 0x1F631,
    "thinking": 0x1F914,
    "winking": 0x1F609,
    "cool": 0x1F60E,
    "relaxed": 0x1F60C,
    "delicious": 0x1F924,
    "kissy": 0x1F618,
    "confident": 0x1F60F,
    "sleepy": 0x1F634,
    "silly": 0x1F61C,
    "confused": 0x1F644,
}


def test_table_matches_protocol_doc():
    assert {name: ord(emoji) for name, emoji in EMOTIONS.items()} == PROTOCOL_TABLE
    assert len(EMOTIONS) == 21


@pytest.mark.parametrize("name", sorted(PROTOCOL_TABLE))
def test_emoji_maps_back_to_its_name(name):
    assert emotion_for_emoji(chr(PROTOCOL_TABLE[name])) == name
    assert is_emotion(name)


def test_incumbent_astonished_face_means_surprised():
    assert emotion_for_emoji("\U0001f632") == "surprised"
    assert find_emotion("wow \U0001f632") == ("\U0001f632", "surprised")


def test_variation_selector_is_tolerated():
    assert emotion_for_emoji("\U0001f642\ufe0f") == "happy"


@pytest.mark.parametrize("ch", ["a", "", "\U0001f600", "\u2764", "happy"])
def test_unknown_emoji(ch):
    assert emotion_for_emoji(ch) is None


def test_find_emotion_returns_first_known_emoji():
    assert find_emotion("好的\U0001f600！\U0001f914 然后 \U0001f60e") == ("\U0001f914", "thinking")


@pytest.mark.parametrize("text", ["", "no emoji here", "\U0001f600\u2764", "happy"])
def test_find_emotion_without_known_emoji(text):
    assert find_emotion(text) is None


def test_default_emotion():
    assert DEFAULT_EMOTION == ("\U0001f642", "happy")
    assert not is_emotion("joyful")

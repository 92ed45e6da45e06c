import json
from pathlib import Path

import pytest

from cosyvoice.text.tokenizer import (
    COSYVOICE3_ADDED_TOKENS,
    ENDOFPROMPT,
    CosyVoice3Tokenizer,
    TokenizerError,
)


def byte_alphabet() -> list[str]:
    """GPT-2 byte-level alphabet: printable Latin-1 bytes map to themselves, the rest to U+0100.."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars, shift = {}, 0
    for byte in range(256):
        if byte in printable:
            chars[byte] = chr(byte)
        else:
            chars[byte] = chr(256 + shift)
            shift += 1
    return [chars[byte] for byte in range(256)]


MERGES = [("h", "e"), ("l", "l"), ("he", "ll"), ("hell", "o"), ("Ġ", "w"), ("Ġw", "o")]


def write_tokenizer_files(directory: Path, merges: list[tuple[str, str]] = MERGES) -> Path:
    vocab = {token: i for i, token in enumerate(byte_alphabet())}
    for left, right in merges:
        vocab.setdefault(left + right, len(vocab))
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    lines = "".join(f"{left} {right}\n" for left, right in merges)
    (directory / "merges.txt").write_text(lines, encoding="utf-8")
    return directory


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> CosyVoice3Tokenizer:
    return CosyVoice3Tokenizer.from_dir(write_tokenizer_files(tmp_path_factory.mktemp("tok")))


def ids_of(tokenizer: CosyVoice3Tokenizer, *tokens: str) -> list[int]:
    return [tokenizer.token_to_id(token) for token in tokens]


def test_special_token_ids_follow_the_vocabulary(tiny: CosyVoice3Tokenizer) -> None:
    base = tiny.base_vocab_size
    assert len(COSYVOICE3_ADDED_TOKENS) == 280
    assert len(tiny) == base + 281
    assert tiny.token_to_id("<|endoftext|>") == base
    assert ids_of(tiny, "<|im_start|>", "<|im_end|>", ENDOFPROMPT, "[breath]") == [
        base + 1,
        base + 2,
        base + 3,
        base + 4,
    ]
    assert tiny.endofprompt_id == base + 3
    assert tiny.convert_tokens_to_ids(COSYVOICE3_ADDED_TOKENS) == list(range(base + 1, base + 281))
    assert tiny.token_to_id("[ǜ]") == base + 280


def test_bpe_merges_apply_in_priority_order(tiny: CosyVoice3Tokenizer) -> None:
    assert tiny.encode("hello") == ids_of(tiny, "hello")
    assert tiny.encode("hello wo") == ids_of(tiny, "hello", "Ġwo")
    # "w" without a leading space never meets the "Ġ w" merge
    assert tiny.encode("wo") == ids_of(tiny, "w", "o")


def test_pretokenizer_splits_digits_and_punctuation(tiny: CosyVoice3Tokenizer) -> None:
    assert tiny.encode("12") == ids_of(tiny, "1", "2")
    assert tiny.encode("hello!") == ids_of(tiny, "hello", "!")


def test_special_tokens_match_anywhere_leftmost_longest(tiny: CosyVoice3Tokenizer) -> None:
    base = tiny.base_vocab_size
    assert tiny.encode("x[a][ai]") == [*ids_of(tiny, "x"), *ids_of(tiny, "[a]", "[ai]")]
    assert tiny.encode("[ai]")[0] != tiny.token_to_id("[a]")
    text_ids = tiny.encode("hello<|endofprompt|>hello")
    assert text_ids == [*ids_of(tiny, "hello"), base + 3, *ids_of(tiny, "hello")]
    # near misses are ordinary text
    assert base + 4 not in tiny.encode("[Breath] [breath")


def test_text_is_nfc_normalised_but_specials_are_not(tiny: CosyVoice3Tokenizer) -> None:
    assert tiny.encode("e\u0301") == tiny.encode("\u00e9")
    decomposed = "[i" + "a\u030c" + "ng]"  # decomposed [iǎng] is not the special token
    assert tiny.token_to_id("[iǎng]") not in tiny.encode(decomposed)


def test_chinese_is_byte_level_without_bos_or_eos(tiny: CosyVoice3Tokenizer) -> None:
    ids = tiny.encode("你好")
    assert len(ids) == 6  # three UTF-8 bytes per character, no merges for them here
    assert all(i < tiny.base_vocab_size for i in ids)
    assert tiny.encode("") == []


def test_decode_round_trip_and_skip_specials(tiny: CosyVoice3Tokenizer) -> None:
    ids = tiny.encode("hello 你好<|endofprompt|>[breath] wo")
    assert tiny.decode(ids, skip_special_tokens=False) == "hello 你好<|endofprompt|>[breath] wo"
    assert tiny.decode(ids) == "hello 你好 wo"
    assert tiny.is_special(tiny.endofprompt_id) and not tiny.is_special(ids[0])


def test_encode_batch_matches_encode(tiny: CosyVoice3Tokenizer) -> None:
    texts = ["hello", "[mn] wo", "你"]
    assert tiny.encode_batch(texts) == [tiny.encode(text) for text in texts]


def test_bad_arguments_raise_tokenizer_error(tiny: CosyVoice3Tokenizer) -> None:
    with pytest.raises(TokenizerError, match="unknown token"):
        tiny.token_to_id("<|nope|>")
    with pytest.raises(TokenizerError, match="must be a str"):
        tiny.encode(b"hello")  # type: ignore[arg-type]


def test_missing_files_are_named(tmp_path: Path) -> None:
    directory = write_tokenizer_files(tmp_path / "a")
    (directory / "merges.txt").unlink()
    with pytest.raises(TokenizerError, match=r"merges.txt: file not found"):
        CosyVoice3Tokenizer.from_dir(directory)
    with pytest.raises(TokenizerError, match=r"vocab.json: file not found"):
        CosyVoice3Tokenizer.from_dir(tmp_path / "b")


def test_inconsistent_files_are_rejected(tmp_path: Path) -> None:
    directory = write_tokenizer_files(tmp_path / "a")
    vocab = json.loads((directory / "vocab.json").read_text(encoding="utf-8"))
    (directory / "vocab.json").write_text(json.dumps({**vocab, ENDOFPROMPT: len(vocab)}), encoding="utf-8")
    with pytest.raises(TokenizerError, match="already in the vocabulary"):
        CosyVoice3Tokenizer.from_dir(directory)

    directory = write_tokenizer_files(tmp_path / "b")
    config = {"added_tokens_decoder": {"5": {"content": "<|endoftext|>"}}}
    (directory / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    with pytest.raises(
        TokenizerError, match=r"tokenizer_config.json: added token '<\|endoftext\|>' should have id 5"
    ):
        CosyVoice3Tokenizer.from_dir(directory)

    directory = write_tokenizer_files(tmp_path / "c")
    (directory / "merges.txt").write_text("h e x\n", encoding="utf-8")
    with pytest.raises(TokenizerError, match=r"merges.txt:1: a merge must be two tokens"):
        CosyVoice3Tokenizer.from_dir(directory)


def test_matching_tokenizer_config_is_accepted(tmp_path: Path) -> None:
    directory = write_tokenizer_files(tmp_path)
    base = len(json.loads((directory / "vocab.json").read_text(encoding="utf-8")))
    config = {"added_tokens_decoder": {str(base + 2): {"content": "<|im_end|>"}}}
    (directory / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    assert CosyVoice3Tokenizer.from_dir(directory).token_to_id("<|im_end|>") == base + 2

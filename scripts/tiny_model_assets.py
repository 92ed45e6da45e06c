"""Text and graph assets of a generated CosyVoice3 model directory (used by ``make_tiny_model.py``).

* :func:`write_tokenizer` - ``vocab.json`` / ``merges.txt`` / ``tokenizer_config.json``: a small
  byte-level BPE (256 byte symbols plus merges learned from a built-in zh/en sample) padded with
  unreachable filler entries to exactly 151643 regular tokens, so the special tokens the loader appends
  get their release ids (``<|endoftext|>`` 151643, ``<|endofprompt|>`` 151646, ...). Like the release
  (whose merges.txt drops multi-character Chinese tokens), Chinese text tokenizes one character at a time.
* :func:`write_onnx_models` - stand-ins for ``campplus.onnx`` (fbank ``input`` [1, T, 80] ->
  ``output`` [1, 192]) and ``speech_tokenizer_v3.onnx`` (``feats`` [1, 128, T] float32 +
  ``feats_length`` [1] int32 -> ``indices`` [1, 1, ceil(T / 4)] int64 in 0..6560: two stride-2 convs and
  an 8-dim ternary FSQ code). Needs the ``onnx`` package (a test extra), imported only here.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import numpy as np
from tokenizers import Regex, pre_tokenizers

from cosyvoice.text.tokenizer import QWEN2_SPLIT_PATTERN

__all__ = ["REGULAR_VOCAB_SIZE", "write_onnx_models", "write_tokenizer"]

REGULAR_VOCAB_SIZE = 151643  # Qwen2's regular entries; the special tokens follow from this id
NUM_MERGES = 400
FILLER_PREFIX = "\u2400"  # not a byte-level symbol, so no text can ever reach a filler entry

# Training text for the small BPE (our own sentences).
_SAMPLE_TEXT = """\
You are a helpful assistant. You are a helpful assistant. You are a helpful assistant.
Hello there! This is a small test of the speech synthesis engine, running with random weights.
The quick brown fox jumps over the lazy dog. She sells sea shells by the sea shore.
Please call me back at 10:30 tomorrow morning; the meeting was moved to room 42.
It is raining today, so take an umbrella when you go out. What time is it now?
We tested the streaming mode and the offline mode, and both of them produced audio.
你好，欢迎使用语音合成服务。今天天气很好，我们一起去公园散步吧。
请问现在几点了？明天上午十点在会议室开会，请不要迟到。
这是一个测试句子，用来检查流式合成和离线合成的结果是否一致。
小智是一个可爱的语音助手，它可以回答问题、讲故事，还可以播放音乐。
"""


def byte_symbols() -> list[str]:
    """GPT-2's byte -> printable character table (index = byte value)."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    table: dict[int, str] = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return [table[b] for b in range(256)]


def _joins_chinese(token: str, decode: dict[str, int]) -> bool:
    """True when the byte-level token holds a whole CJK ideograph plus anything else (another character,
    a space, punctuation or a partial character): such merges are never learned, so Chinese text always
    tokenizes one character at a time, as with the release's pruned merges."""
    raw = bytes(decode[c] for c in token)
    text = raw.decode("utf-8", errors="ignore")
    return len(raw) > 3 and any("\u4e00" <= c <= "\u9fff" for c in text)


def learn_merges(text: str, num_merges: int = NUM_MERGES) -> list[tuple[str, str]]:
    """Greedy byte-level BPE on ``text`` pre-split like Qwen2 (most frequent pair first, ties by order)."""
    symbols = byte_symbols()
    decode = {c: b for b, c in enumerate(symbols)}
    splitter = pre_tokenizers.Split(Regex(QWEN2_SPLIT_PATTERN), behavior="isolated", invert=False)
    words = Counter(
        tuple(symbols[b] for b in piece.encode("utf-8")) for piece, _ in splitter.pre_tokenize_str(text)
    )
    merges: list[tuple[str, str]] = []
    banned: set[tuple[str, str]] = set()
    while len(merges) < num_merges:
        pairs: Counter[tuple[str, str]] = Counter()
        for word, count in words.items():
            for pair in zip(word, word[1:], strict=False):
                pairs[pair] += count
        candidates = [(-n, pair) for pair, n in pairs.items() if pair not in banned]
        if not candidates:
            break
        _, best = min(candidates)
        if _joins_chinese(best[0] + best[1], decode):
            banned.add(best)  # one token per Chinese character
            continue
        merges.append(best)
        merged: Counter[tuple[str, ...]] = Counter()
        for word, count in words.items():
            out, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == best:
                    out.append(word[i] + word[i + 1])
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            merged[tuple(out)] += count
        words = merged
    return merges


def _special_entry(content: str) -> dict:
    return {
        "content": content,
        "lstrip": False,
        "normalized": False,
        "rstrip": False,
        "single_word": False,
        "special": True,
    }


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".part")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def write_tokenizer(directory: Path) -> None:
    """Write vocab.json, merges.txt and tokenizer_config.json (Qwen2 tokenizer layout) to ``directory``."""
    merges = learn_merges(_SAMPLE_TEXT)
    vocab: dict[str, int] = {}
    for token in byte_symbols() + [a + b for a, b in merges]:
        vocab.setdefault(token, len(vocab))
    filler = 0
    while len(vocab) < REGULAR_VOCAB_SIZE:
        vocab[f"{FILLER_PREFIX}{filler}"] = len(vocab)
        filler += 1
    _atomic_write(directory / "vocab.json", json.dumps(vocab, ensure_ascii=False).encode("utf-8"))
    _atomic_write(directory / "merges.txt", "".join(f"{a} {b}\n" for a, b in merges).encode("utf-8"))
    specials = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
    config = {
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(REGULAR_VOCAB_SIZE + i): _special_entry(token) for i, token in enumerate(specials)
        },
        "additional_special_tokens": list(specials[1:]),
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 32768,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }
    _atomic_write(directory / "tokenizer_config.json", json.dumps(config, indent=2).encode("utf-8"))


def _save_onnx(onnx, graph, path: Path) -> None:
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    _atomic_write(path, model.SerializeToString())


def write_onnx_models(directory: Path, rng: np.random.Generator) -> None:
    """Write ``campplus.onnx`` and ``speech_tokenizer_v3.onnx`` stand-ins (raises ImportError without onnx)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    def init(name: str, shape: tuple[int, ...], std: float) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) * std).astype(np.float32), name)

    # CAM++ stand-in: utterance mean of the fbank, a tanh layer, then a projection to 192 dims.
    campplus = helper.make_graph(
        [
            helper.make_node("ReduceMean", ["input"], ["pooled"], axes=[1], keepdims=0),  # [1, 80]
            helper.make_node("MatMul", ["pooled", "w1"], ["h1"]),  # [1, 256]
            helper.make_node("Add", ["h1", "b1"], ["h2"]),
            helper.make_node("Tanh", ["h2"], ["h3"]),
            helper.make_node("MatMul", ["h3", "w2"], ["output"]),  # [1, 192]
        ],
        "campplus_stand_in",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, "T", 80])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 192])],
        initializer=[init("w1", (80, 256), 0.3), init("b1", (256,), 0.1), init("w2", (256, 192), 1.0)],
    )
    _save_onnx(onnx, campplus, directory / "campplus.onnx")

    # Speech tokenizer stand-in: 4x downsampling convs, then an 8-dim ternary code -> index 0..6560.
    channels = 64
    conv = {"kernel_shape": [3], "strides": [2], "pads": [1, 1]}
    powers = (3.0 ** np.arange(8, dtype=np.float32)).reshape(8, 1)  # [8, 1]
    tokenizer = helper.make_graph(
        [
            helper.make_node("Conv", ["feats", "c1_w", "c1_b"], ["c1"], **conv),  # [1, C, ceil(T/2)]
            helper.make_node("Tanh", ["c1"], ["a1"]),
            helper.make_node("Conv", ["a1", "c2_w", "c2_b"], ["c2"], **conv),  # [1, 8, ceil(T/4)]
            helper.make_node("Tanh", ["c2"], ["a2"]),
            helper.make_node("Round", ["a2"], ["r"]),  # {-1, 0, 1}
            helper.make_node("Add", ["r", "one"], ["digits"]),  # {0, 1, 2}
            helper.make_node("Transpose", ["digits"], ["digits_t"], perm=[0, 2, 1]),  # [1, T', 8]
            helper.make_node("MatMul", ["digits_t", "powers"], ["code"]),  # [1, T', 1]
            helper.make_node("Transpose", ["code"], ["code_t"], perm=[0, 2, 1]),  # [1, 1, T']
            helper.make_node("Cast", ["code_t"], ["indices"], to=TensorProto.INT64),
        ],
        "speech_tokenizer_stand_in",
        [
            helper.make_tensor_value_info("feats", TensorProto.FLOAT, [1, 128, "T"]),
            helper.make_tensor_value_info("feats_length", TensorProto.INT32, [1]),
        ],
        [helper.make_tensor_value_info("indices", TensorProto.INT64, [1, 1, "U"])],
        initializer=[
            init("c1_w", (channels, 128, 3), 1.0 / np.sqrt(128 * 3)),
            init("c1_b", (channels,), 0.1),
            init("c2_w", (8, channels, 3), 2.0 / np.sqrt(channels * 3)),
            init("c2_b", (8,), 0.1),
            numpy_helper.from_array(np.ones(1, dtype=np.float32), "one"),
            numpy_helper.from_array(powers, "powers"),
        ],
    )
    _save_onnx(onnx, tokenizer, directory / "speech_tokenizer_v3.onnx")

"""The CosyVoice3 text tokenizer: Qwen2 byte-level BPE plus the CosyVoice special tokens.

Built with Hugging Face ``tokenizers`` from ``CosyVoice-BlankEN/vocab.json`` and ``merges.txt`` (the
release has no ``tokenizer.json``). Encoding: the 281 special strings are matched first, exactly and
anywhere (leftmost, then longest); every text segment between them is NFC-normalised, split with the
Qwen2 pre-tokenizer regex, byte-mapped and BPE-merged; no BOS/EOS is added. Ids: the regular vocabulary
(151643 entries in the release), then ``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>``, then the
CosyVoice3 additions in list order, so ``<|endofprompt|>`` is 151646 and the length is 151924.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

from cosyvoice.files import read_json_object

__all__ = [
    "COSYVOICE3_ADDED_TOKENS",
    "ENDOFPROMPT",
    "ENDOFTEXT",
    "CosyVoice3Tokenizer",
    "TokenizerError",
]

ENDOFTEXT = "<|endoftext|>"
ENDOFPROMPT = "<|endofprompt|>"
_QWEN2_SPECIALS = (ENDOFTEXT, "<|im_start|>", "<|im_end|>")  # already in Qwen2, ids follow the vocab

# Qwen2's pre-tokenizer: contractions, letter runs (with one leading non-letter), single digits,
# punctuation runs, newline runs, then whitespace.
QWEN2_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

_ARPABET_PHONES = (
    "AA AA0 AA1 AA2 AE AE0 AE1 AE2 AH AH0 AH1 AH2 AO AO0 AO1 AO2 AW AW0 AW1 AW2 AY AY0 AY1 AY2 B CH D "
    "DH EH EH0 EH1 EH2 ER ER0 ER1 ER2 EY EY0 EY1 EY2 F G HH IH IH0 IH1 IH2 IY IY0 IY1 IY2 JH K L M N "
    "NG OW OW0 OW1 OW2 OY OY0 OY1 OY2 P R S SH T TH UH UH0 UH1 UH2 UW UW0 UW1 UW2 V W Y Z ZH"
).split()

_PINYIN_UNITS = (
    "a ai an ang ao b c ch d e ei en eng f g h i ian in ing iu ià iàn iàng iào iá ián iáng iáo iè ié "
    "iòng ióng iù iú iā iān iāng iāo iē iě iōng iū iǎ iǎn iǎng iǎo iǒng iǔ j k l m n o ong ou p q r s "
    "sh t u uang ue un uo uà uài uàn uàng uá uái uán uáng uè ué uì uí uò uó uā uāi uān uāng uē uě uī "
    "uō uǎ uǎi uǎn uǎng uǐ uǒ vè w x y z zh à ài àn àng ào á ái án áng áo è èi èn èng èr é éi én éng "
    "ér ì ìn ìng í ín íng ò òng òu ó óng óu ù ùn ú ún ā āi ān āng āo ē ēi ēn ēng ě ěi ěn ěng ěr ī īn "
    "īng ō ōng ōu ū ūn ǎ ǎi ǎn ǎng ǎo ǐ ǐn ǐng ǒ ǒng ǒu ǔ ǔn ǘ ǚ ǜ"
).split()

_CONTROL_AND_TAGS = (
    "<|im_start|>",
    "<|im_end|>",
    ENDOFPROMPT,
    "[breath]",
    "<strong>",
    "</strong>",
    "[noise]",
    "[laughter]",
    "[cough]",
    "[clucking]",
    "[accent]",
    "[quick_breath]",
    "<laughter>",
    "</laughter>",
    "[hissing]",
    "[sigh]",
    "[vocalized-noise]",
    "[lipsmack]",
    "[mn]",
    "<|endofsystem|>",
)

# CosyVoice3's additional special tokens (280, in id order): control tokens and paralinguistic tags,
# ARPAbet phones, then pinyin initials/finals with tone marks, each phone/unit in square brackets.
COSYVOICE3_ADDED_TOKENS: tuple[str, ...] = (
    _CONTROL_AND_TAGS + tuple(f"[{p}]" for p in _ARPABET_PHONES) + tuple(f"[{u}]" for u in _PINYIN_UNITS)
)


class TokenizerError(ValueError):
    """Tokenizer files are missing or inconsistent, or a token/text argument is invalid."""


def _read_merges(path: Path) -> list[tuple[str, str]]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError as exc:
        raise TokenizerError(f"{path}: file not found") from exc
    merges = []
    for number, line in enumerate(lines, start=1):
        if not line or (number == 1 and line.startswith("#version")):
            continue
        parts = line.split(" ")
        if len(parts) != 2:
            raise TokenizerError(f"{path}:{number}: a merge must be two tokens separated by one space")
        merges.append((parts[0], parts[1]))
    return merges


class CosyVoice3Tokenizer:
    """Text -> LLM text-token ids, exactly as the official CosyVoice3 frontend encodes them."""

    def __init__(self, vocab_path: str | Path, merges_path: str | Path) -> None:
        vocab_path = Path(vocab_path)
        vocab = read_json_object(vocab_path, TokenizerError)
        clashes = [token for token in (*_QWEN2_SPECIALS, *COSYVOICE3_ADDED_TOKENS) if token in vocab]
        if clashes:
            raise TokenizerError(f"{vocab_path}: special tokens already in the vocabulary: {clashes[:5]}")
        if sorted(vocab.values()) != list(range(len(vocab))):
            raise TokenizerError(f"{vocab_path}: ids must be exactly 0..{len(vocab) - 1}")
        bpe = models.BPE(vocab=vocab, merges=_read_merges(Path(merges_path)), ignore_merges=False)
        tokenizer = Tokenizer(bpe)
        tokenizer.normalizer = normalizers.NFC()
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(QWEN2_SPLIT_PATTERN), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
        tokenizer.decoder = decoders.ByteLevel()
        self.special_tokens: tuple[str, ...] = (*_QWEN2_SPECIALS, *COSYVOICE3_ADDED_TOKENS[2:])
        tokenizer.add_special_tokens(
            [AddedToken(t, special=True, normalized=False) for t in self.special_tokens]
        )
        self.base_vocab_size = len(vocab)
        for offset, token in enumerate(self.special_tokens):
            if tokenizer.token_to_id(token) != self.base_vocab_size + offset:
                raise TokenizerError(f"{vocab_path}: special token {token!r} did not get id base + {offset}")
        self._tokenizer = tokenizer
        self._special_ids = frozenset(
            range(self.base_vocab_size, self.base_vocab_size + len(self.special_tokens))
        )

    @classmethod
    def from_dir(cls, directory: str | Path) -> CosyVoice3Tokenizer:
        """Load from a ``CosyVoice-BlankEN`` directory; check ``tokenizer_config.json`` ids if present."""
        directory = Path(directory)
        tokenizer = cls(directory / "vocab.json", directory / "merges.txt")
        config_path = directory / "tokenizer_config.json"
        if config_path.is_file():
            added = read_json_object(config_path, TokenizerError).get("added_tokens_decoder", {})
            for token_id, entry in added.items():
                content = entry.get("content") if isinstance(entry, dict) else None
                if content is None or tokenizer.token_to_id(content) != int(token_id):
                    raise TokenizerError(f"{config_path}: added token {content!r} should have id {token_id}")
        return tokenizer

    def __len__(self) -> int:
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    @property
    def endofprompt_id(self) -> int:
        return self.token_to_id(ENDOFPROMPT)

    @property
    def endoftext_id(self) -> int:
        return self.token_to_id(ENDOFTEXT)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; special strings anywhere in it become their single ids."""
        if not isinstance(text, str):
            raise TokenizerError(f"text must be a str, got {type(text).__name__}")
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        for text in texts:
            if not isinstance(text, str):
                raise TokenizerError(f"texts must be str, got {type(text).__name__}")
        return [e.ids for e in self._tokenizer.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Iterable[int], *, skip_special_tokens: bool = True) -> str:
        return self._tokenizer.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int:
        token_id = self._tokenizer.token_to_id(token)
        if token_id is None:
            raise TokenizerError(f"unknown token {token!r}")
        return token_id

    def convert_tokens_to_ids(self, tokens: Iterable[str]) -> list[int]:
        return [self.token_to_id(token) for token in tokens]

    def is_special(self, token_id: int) -> bool:
        return token_id in self._special_ids

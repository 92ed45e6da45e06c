"""CosyVoice3 text stage: the Qwen2 BPE tokenizer with the CosyVoice special tokens (``tokenizer``), the
LLM prompt layouts, upstream's text normalisation steps and sentence splitting (``prompt``), and the basic
reading of numbers as words (``numbers``; the engine's text normaliser falls back to it)."""

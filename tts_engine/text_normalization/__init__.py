"""Text normalisation, run by the engine before a stream opens, for every backend that does not read raw
text: ``normalizer`` (wetext, basic, off) and ``wetext_rules`` (our rules where wetext reads wrongly);
docs/text-normalization.md."""

from tts_engine.text_normalization.normalizer import TextNormalization, TextNormalizer, split_sentences

__all__ = ["TextNormalization", "TextNormalizer", "split_sentences"]

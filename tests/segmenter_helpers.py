"""Feeding a fresh SentenceSegmenter a text whole or in pieces, then flushing (the segmenter tests)."""

from gateway.speech.segmenter import SentenceSegmenter


def segment_whole(text: str, kwargs: dict) -> list[str]:
    segmenter = SentenceSegmenter(**kwargs)
    return segmenter.push(text) + segmenter.flush()


def segment_pieces(pieces: list[str], kwargs: dict) -> list[str]:
    segmenter = SentenceSegmenter(**kwargs)
    segments: list[str] = []
    for piece in pieces:
        segments += segmenter.push(piece)
    return segments + segmenter.flush()

"""Prompt-audio frontend: features, resampling, ONNX speaker/speech-token models, speaker records."""

"""What a device hears: a turn (turn.py, built by turns.py) turns the LLM's reply (reply.py) into
sentences (segmenter.py, text_cleaning.py), speaks them through the engine (speaker.py) in the
session's voice (voice_choice.py) as paced Opus frames (pacer.py); phrases.py keeps the fixed
phrases as audio."""

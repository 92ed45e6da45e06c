"""Voice presets on disk: the preset folder (store.py) and one preset's files (files.py)."""

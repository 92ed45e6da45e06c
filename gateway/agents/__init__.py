"""Agents: named profiles a device talks with (``profile.py``), kept in the store (``store.py``), the
LLM clients they use (``llm_pool.py``) and what a turn resolves for its device (``active.py``).
docs/devices-and-agents.md."""

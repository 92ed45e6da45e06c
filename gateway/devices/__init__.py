"""Devices: the registry of every device that called OTA or connected (``registry.py``, its tables in
``tables.py``), activation by code (``activation.py``, ``rate_limit.py``) and the operator's command line
(``cli.py``: ``python -m gateway devices ...``). docs/devices-and-agents.md."""

"""The gateway's edges: API keys and body caps before any handler (http_guard.py), device admission
and tokens (device_tokens.py), no credentials in logs (log_redaction.py)."""

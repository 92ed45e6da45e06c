"""The device side of the gateway: a device's WebSocket (socket.py), its OTA check (ota.py), one
``Session`` per connection (session.py: the reader, turns as tasks, hello, abort) with its listen
modes (listen.py), idle deadlines (idle.py), tools (session_tools.py), uplink endpointing
(listener.py) and the device's MCP tools (mcp_client.py); registry.py: which devices are live."""

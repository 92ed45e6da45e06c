"""What real peers send (firmware, incumbent server) and the events it parses to, for the codec tests."""

from gateway.xiaozhi import (
    Abort,
    Alert,
    AudioParams,
    Goodbye,
    Hello,
    Iot,
    Listen,
    ListenMode,
    ListenState,
    LlmEmotion,
    McpMessage,
    ServerHello,
    Stt,
    SystemCommand,
    TtsSentenceEnd,
    TtsSentenceStart,
    TtsStart,
    TtsStop,
    UnknownMessage,
)

VERSIONS = [1, 2, 3]

# what the firmware sends a server
FIRMWARE_MESSAGES = [
    (
        '{"type":"hello","version":1,"features":{"mcp":true,"glyph_push":false},"transport":"websocket",'
        '"audio_params":{"format":"opus","sample_rate":16000,"channels":1,"frame_duration":60}}',
        Hello(features={"mcp": True, "glyph_push": False}, audio_params=AudioParams()),
    ),
    ('{"type":"hello","version":1,"transport":"websocket"}', Hello()),  # old firmware, no features
    ('{"type":"hello"}', Hello()),
    (
        '{"session_id":"x","type":"listen","state":"start","mode":"auto"}',
        Listen(state=ListenState.START, mode=ListenMode.AUTO),
    ),
    ('{"session_id":"x","type":"listen","state":"start"}', Listen(state=ListenState.START)),
    ('{"session_id":"x","type":"listen","state":"stop"}', Listen(state=ListenState.STOP)),
    (
        '{"session_id":"x","type":"listen","state":"detect","text":"你好小智"}',
        Listen(state=ListenState.DETECT, text="你好小智"),
    ),
    ('{"session_id":"x","type":"listen","state":"detect"}', Listen(state=ListenState.DETECT, text="")),
    ('{"session_id":"x","type":"abort"}', Abort()),
    ('{"session_id":"x","type":"abort","reason":"wake_word_detected"}', Abort(reason="wake_word_detected")),
    ('{"session_id":"x","type":"abort","reason":null}', Abort()),
    (
        '{"session_id":"x","type":"mcp","payload":{"jsonrpc":"2.0","method":"notifications/x"}}',
        McpMessage(payload={"jsonrpc": "2.0", "method": "notifications/x"}),
    ),
    (
        '{"session_id":"x","type":"iot","update":true,"descriptors":[]}',
        Iot(raw={"update": True, "descriptors": []}),
    ),
    ('{"session_id":"x","type":"goodbye"}', Goodbye()),
    ('{"session_id":"x","type":"ping","n":1}', UnknownMessage(type="ping", raw={"n": 1})),
    ('{"type":"tts","state":"start"}', UnknownMessage(type="tts", raw={"state": "start"})),
    (
        '{"type":"hello","version":2.0,"audio_params":{"sample_rate":16000.0},"extra":1}',
        Hello(version=2, audio_params=AudioParams()),
    ),
]

# what the incumbent server sends a device
INCUMBENT_MESSAGES = [
    (
        '{"type":"hello","version":1,"transport":"websocket","session_id":"2b9f",'
        '"audio_params":{"format":"opus","sample_rate":16000,"channels":1,"frame_duration":60}}',
        ServerHello(session_id="2b9f", audio_params=AudioParams()),
    ),
    (
        '{"type":"hello","transport":"websocket"}',
        ServerHello(session_id="", audio_params=AudioParams(sample_rate=24000)),
    ),
    (
        '{"type":"hello","transport":"websocket","audio_params":{"sample_rate":48000}}',
        ServerHello(session_id="", audio_params=AudioParams(sample_rate=48000)),
    ),
    ('{"session_id":"x","type":"tts","state":"start"}', TtsStart()),
    ('{"session_id":"x","type":"tts","state":"sentence_start","text":"晴天"}', TtsSentenceStart(text="晴天")),
    ('{"session_id":"x","type":"tts","state":"sentence_end","text":"晴天"}', TtsSentenceEnd(text="晴天")),
    ('{"session_id":"x","type":"tts","state":"stop"}', TtsStop()),
    ('{"session_id":"x","type":"stt","text":"今天天气怎么样"}', Stt(text="今天天气怎么样")),
    ('{"session_id":"x","type":"llm","text":"😊","emotion":"happy"}', LlmEmotion(emotion="happy", text="😊")),
    ('{"type":"llm","emotion":"cool"}', LlmEmotion(emotion="cool")),
    ('{"type":"system","command":"reboot"}', SystemCommand(command="reboot")),
    (
        '{"type":"alert","status":"Warning","message":"Battery low","emotion":"sad"}',
        Alert(status="Warning", message="Battery low", emotion="sad"),
    ),
    ('{"type":"custom","payload":{"a":1}}', UnknownMessage(type="custom", raw={"payload": {"a": 1}})),
    ('{"type":"abort"}', UnknownMessage(type="abort", raw={})),
]

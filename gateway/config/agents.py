"""The `agents` section: agents' bounds and the expressive-speech table (gateway/agents)."""

from __future__ import annotations

from pydantic import Field, field_validator

from gateway.config.base import Section

# The reply's emotion (the emoji the LLM opens with, gateway/speech/reply.py) -> a CosyVoice3 instruct
# text for that reply, for agents with expressive speech on. Emotions not listed keep the agent's own.
DEFAULT_EXPRESSIVE_INSTRUCTS: dict[str, str] = {
    "happy": "请用开心的语气说",
    "laughing": "请用非常开心、带着笑意的语气说",
    "funny": "请用幽默风趣的语气说",
    "loving": "请用温柔亲切的语气说",
    "kissy": "请用温柔亲切的语气说",
    "sad": "请用悲伤低落的语气说",
    "crying": "请用伤心难过的语气说",
    "angry": "请用生气的语气说",
    "surprised": "请用惊讶的语气说",
    "shocked": "请用非常震惊的语气说",
    "embarrassed": "请用害羞的语气说",
    "thinking": "请用思考、沉吟的语气说",
    "relaxed": "请用轻松平静的语气说",
    "sleepy": "请用慵懒困倦的语气说",
    "confident": "请用自信的语气说",
    "cool": "请用酷酷的语气说",
    "silly": "请用调皮的语气说",
}


class AgentsConfig(Section):
    """Agents: named profiles that devices are bound to (docs/devices-and-agents.md)."""

    max_agents: int = Field(200, ge=1, le=100_000)
    # LLM clients kept open per gateway (one per distinct endpoint, model, key and temperature);
    # the least recently used idle one is closed past this.
    llm_clients: int = Field(16, ge=1, le=1000)
    expressive_instructs: dict[str, str] = Field(default_factory=lambda: dict(DEFAULT_EXPRESSIVE_INSTRUCTS))

    @field_validator("expressive_instructs")
    @classmethod
    def _known_emotions(cls, v: dict[str, str]) -> dict[str, str]:
        from gateway.xiaozhi.emotions import EMOTIONS

        unknown = sorted(set(v) - set(EMOTIONS))
        if unknown:
            raise ValueError(f"unknown emotions {unknown}; the firmware's are {', '.join(EMOTIONS)}")
        for emotion, text in v.items():
            if not text.strip() or len(text) > 200:
                raise ValueError(f"{emotion}: an instruct text of 1-200 characters")
        return {emotion: text.strip() for emotion, text in v.items()}

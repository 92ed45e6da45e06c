"""Chat models for the gateway: the ``ChatLLM`` interface, an echo model and an OpenAI-compatible client."""

from gateway.llm.base import ChatLLM, LLMError
from gateway.llm.conversation import Conversation
from gateway.llm.echo import EchoLLM
from gateway.llm.openai_chat import OpenAIChatLLM

__all__ = ["ChatLLM", "Conversation", "EchoLLM", "LLMError", "OpenAIChatLLM"]

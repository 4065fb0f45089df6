"""The ChatModel interface and the values it returns."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

from mainspring.engine.outputs import Usage

Message = dict[str, Any]  # OpenAI chat message: role, content, tool_calls, tool_call_id, name
Tool = dict[str, Any]  # OpenAI tool: {"type": "function", "function": {name, description, parameters}}

__all__ = ["ChatModel", "Completion", "CompletionChunk", "Message", "Tool", "ToolCall", "UpstreamError", "Usage"]


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text, exactly as OpenAI returns it; the caller validates it


@dataclass
class Completion:
    text: str
    tool_calls: list[ToolCall]
    finish_reason: str | None  # "stop" | "length" | "tool_calls" | "abort" | upstream's own
    usage: Usage
    model: str

    def to_message(self) -> Message:
        """The assistant message to append to the conversation for the next turn."""
        msg: Message = {"role": "assistant", "content": self.text or None}
        if self.tool_calls:
            msg["tool_calls"] = [{"id": c.id, "type": "function",
                                  "function": {"name": c.name, "arguments": c.arguments}} for c in self.tool_calls]
        return msg


@dataclass
class CompletionChunk:
    """Text as it is produced; the last chunk carries finish_reason, usage and any tool calls."""

    delta_text: str
    finish_reason: str | None = None
    usage: Usage | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)


class UpstreamError(RuntimeError):
    """An OpenAI-compatible endpoint answered with an error (or not at all: status None)."""

    def __init__(self, status: int | None, message: str, body: Any = None) -> None:
        super().__init__(f"upstream {'error ' + str(status) if status else 'unreachable'}: {message}")
        self.status, self.message, self.body = status, message, body


class ModelStopped(UpstreamError):
    """The model's engine stopped after failed steps: nothing is served until its server restarts, so retrying
    is pointless (an agent run parks instead, to be queued again when a worker starts)."""

    def __init__(self, message: str) -> None:
        super().__init__(503, message)


class ChatModel(ABC):
    model: str

    @abstractmethod
    async def chat(self, messages: list[Message], *, tools: list[Tool] | None = None, tool_choice: Any = None,
                   response_format: dict | None = None, max_tokens: int = 1024, temperature: float = 1.0,
                   seed: int | None = None, stop: list[str] | str | None = None) -> Completion: ...

    @abstractmethod
    def stream(self, messages: list[Message], *, tools: list[Tool] | None = None, tool_choice: Any = None,
               response_format: dict | None = None, max_tokens: int = 1024, temperature: float = 1.0,
               seed: int | None = None, stop: list[str] | str | None = None) -> AsyncIterator[CompletionChunk]: ...

    async def aclose(self) -> None:  # noqa: B027 -- optional hook: most models hold nothing to release
        """Release connections; the base model holds none."""


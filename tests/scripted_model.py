"""TEST-ONLY ChatModel that replays canned answers."""

from __future__ import annotations

from typing import Any, AsyncIterator

from mainspring.models import ChatModel, Completion, CompletionChunk, Message, ToolCall, Usage
from mainspring.tool_calls.normalize import content_text


class ScriptedModel(ChatModel):
    """TEST-ONLY: replays `responses` in order (str, Completion, ToolCall, list[ToolCall] or an
    exception to raise) and records every call's arguments in `calls`. Usage counts words, not tokens.
    """

    def __init__(self, responses: list[Any], model: str = "scripted") -> None:
        self.responses, self.model, self.calls = list(responses), model, []

    def _next(self, messages: list[Message], kwargs: dict) -> Completion:
        self.calls.append({"messages": messages, **kwargs})
        if not self.responses:
            raise AssertionError(f"ScriptedModel ran out of responses after {len(self.calls) - 1} calls")
        r = self.responses.pop(0)
        if isinstance(r, BaseException):
            raise r
        if isinstance(r, Completion):
            return r
        prompt = sum(len(content_text(m.get("content"), "messages").split()) for m in messages)
        calls = [r] if isinstance(r, ToolCall) else r if isinstance(r, list) else []
        text = r if isinstance(r, str) else ""
        return Completion(text, calls, "tool_calls" if calls else "stop",
                          Usage(prompt, 0, max(1, len(text.split()))), self.model)

    async def chat(self, messages: list[Message], **kwargs: Any) -> Completion:
        return self._next(messages, kwargs)

    async def stream(self, messages: list[Message], **kwargs: Any) -> AsyncIterator[CompletionChunk]:
        done = self._next(messages, kwargs)
        words = done.text.split(" ") if done.text else []
        for i, w in enumerate(words):
            yield CompletionChunk(w if i == len(words) - 1 else w + " ")
        yield CompletionChunk("", done.finish_reason, done.usage, done.tool_calls)

"""A scripted ChatModel for the loop's tests: it answers from a list, checks each answer against
the response format it was asked for (so a script cannot say what constrained decoding would
not let a model say), and records every prompt. Usage counts characters, with the prompt
prefix it saw before as `cached` (what a prefix cache would serve)."""

from __future__ import annotations

import json
from typing import Any, AsyncIterator, Callable

import jsonschema

from mainspring.models.base import ChatModel, Completion, CompletionChunk, Message, Usage

Answer = str | Callable[[list[Message]], str]


class ScriptedModel(ChatModel):
    model = "scripted"

    def __init__(self, answers: list[Answer]) -> None:
        self.answers = list(answers)
        self.calls: list[dict[str, Any]] = []
        self._seen: list[str] = []

    async def chat(self, messages: list[Message], *, response_format: dict | None = None, max_tokens: int = 1024,
                   **kwargs: Any) -> Completion:
        if not self.answers:
            raise AssertionError(f"no answer scripted for call {len(self.calls)}")
        answer = self.answers.pop(0)
        text = answer(messages) if callable(answer) else answer
        schema = (response_format or {}).get("json_schema", {}).get("schema")
        if schema is not None:
            errors = [f"{e.json_path}: {e.message}" for e in
                      jsonschema.Draft202012Validator(schema).iter_errors(json.loads(text))]
            assert errors == [], f"call {len(self.calls)}: the grammar would not allow {text}: {errors}"
        prompt = json.dumps(messages)
        cached = max((_common(prompt, seen) for seen in self._seen), default=0)
        self._seen.append(prompt)
        self.calls.append({"messages": json.loads(prompt), "response_format": response_format,
                           "max_tokens": max_tokens, "temperature": kwargs.get("temperature"),
                           "seed": kwargs.get("seed")})
        return Completion(text, [], "stop", Usage(len(prompt), cached, len(text)), self.model)

    def stream(self, messages: list[Message], **kwargs: Any) -> AsyncIterator[CompletionChunk]:
        raise NotImplementedError


def _common(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n

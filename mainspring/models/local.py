"""LocalModel: the embedded engine behind ChatModel, prompted exactly as the HTTP API prompts it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, AsyncIterator

from mainspring.engine.errors import EngineStepError, EngineStoppedError, InvalidRequestError
from mainspring.engine.params import SamplingParams
from mainspring.models.base import (ChatModel, Completion, CompletionChunk, Message, ModelStopped, Tool, ToolCall,
                                    UpstreamError, Usage)
from mainspring.tool_calls import (ParsedCall, ToolCallStream, ToolChoice, ToolSpec, finish_reason, guided_decoding,
                                   openai_messages, openai_tool_choice, openai_tools, parse_answer, render_prompt)

if TYPE_CHECKING:
    from mainspring.engine.async_engine import AsyncLLMEngine


def _calls(parsed: list[ParsedCall]) -> list[ToolCall]:
    return [ToolCall(c.id, c.name, c.arguments_json) for c in parsed]


@contextmanager
def _engine_errors() -> Iterator[None]:
    """The engine's failures in ChatModel's words: a failed step may pass (retry it), a stopped engine will not."""
    try:
        yield
    except EngineStoppedError as exc:
        raise ModelStopped(str(exc)) from exc
    except EngineStepError as exc:
        raise UpstreamError(500, str(exc)) from exc


def _constraint(tools: list[ToolSpec], choice: ToolChoice, response_format: dict | None) -> dict[str, Any]:
    kind = (response_format or {}).get("type") or "text"
    schema = None
    if kind == "json_schema":
        spec = response_format.get("json_schema") if response_format else None
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise InvalidRequestError("response_format json_schema needs a 'schema' object",
                                      param="response_format.json_schema")
    return guided_decoding(tools, choice, kind, schema)


class LocalModel(ChatModel):
    """Chat template, SamplingParams and guided decoding of the embedded engine; tools are offered,
    forced and parsed by `mainspring.tool_calls`, the same code the HTTP routes use."""

    def __init__(self, engine: AsyncLLMEngine, model: str | None = None, cache_salt: str | None = None) -> None:
        self.engine = engine
        self.model = model or engine.engine.name
        self.cache_salt = cache_salt  # tenant isolation of the prefix cache

    def _prepare(self, messages: list[Message], tools: list[Tool] | None, tool_choice: Any,
                 response_format: dict | None, max_tokens: int, temperature: float, seed: int | None,
                 stop: list[str] | str | None) -> tuple[str, SamplingParams, list[ToolSpec], ToolChoice]:
        specs = openai_tools(tools)
        choice = openai_tool_choice(tool_choice, specs)
        params = SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=seed,
                                stop=[stop] if isinstance(stop, str) else stop or [],
                                **_constraint(specs, choice, response_format))
        prompt = render_prompt(self.engine.tokenizer, openai_messages(messages), specs, choice)
        return prompt, params, specs, choice

    def _finish(self, text: str, reason: str | None, usage: Usage | None, tools: list[ToolSpec],
                choice: ToolChoice) -> Completion:
        content, parsed = parse_answer(text, tools, choice, reason)
        return Completion(content or "", _calls(parsed), finish_reason(parsed, reason), usage or Usage(0, 0, 0),
                          self.model)

    async def chat(self, messages: list[Message], *, tools: list[Tool] | None = None, tool_choice: Any = None,
                   response_format: dict | None = None, max_tokens: int = 1024, temperature: float = 1.0,
                   seed: int | None = None, stop: list[str] | str | None = None) -> Completion:
        prompt, params, specs, choice = self._prepare(messages, tools, tool_choice, response_format, max_tokens,
                                                      temperature, seed, stop)
        with _engine_errors():
            out = await self.engine.generate(prompt, params, cache_salt=self.cache_salt)
        return self._finish(out.text, out.finish_reason, out.usage, specs, choice)

    async def stream(self, messages: list[Message], *, tools: list[Tool] | None = None, tool_choice: Any = None,
                     response_format: dict | None = None, max_tokens: int = 1024, temperature: float = 1.0,
                     seed: int | None = None, stop: list[str] | str | None = None) -> AsyncIterator[CompletionChunk]:
        prompt, params, specs, choice = self._prepare(messages, tools, tool_choice, response_format, max_tokens,
                                                      temperature, seed, stop)
        # content streams until the text may be a call; that part is parsed when the answer ends
        holder = ToolCallStream(specs, hold_all=choice.forced, choice=choice) if choice.mode != "none" else None
        with _engine_errors():
            async for out in self.engine.stream(prompt, params, cache_salt=self.cache_salt):
                delta = holder.feed(out.delta_text) if holder is not None else out.delta_text
                if delta:
                    yield CompletionChunk(delta)
                if out.finished:
                    rest, parsed = holder.finish(out.finish_reason) if holder is not None else ("", [])
                    yield CompletionChunk(rest, finish_reason(parsed, out.finish_reason),
                                          out.usage or Usage(0, 0, 0), _calls(parsed))

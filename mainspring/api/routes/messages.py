"""POST /v1/messages: Anthropic's Messages API (text, tool_use / tool_result, streaming events,
structured outputs), and POST /v1/messages/count_tokens: the prompt tokens such a call would use.

Usage follows Anthropic's view of the same engine numbers: `input_tokens` are the prompt tokens
not served from the cache, `cache_read_input_tokens` the cached ones (OpenAI counts those inside
prompt_tokens). The prompt cache is automatic, so nothing is ever billed as a cache write (yet).
A final assistant message is a prefill: the answer continues it, as on Anthropic's API.
Structured outputs (`output_config.format`, what `client.messages.parse(output_format=Model)`
sends) are enforced by the same constrained decoding as OpenAI's response_format; a forced tool
call's own schema wins over it, as in chat.
"""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from mainspring.api.errors import APIError, bad_request, error_body, from_engine_error
from mainspring.api.engine_params import fit_max_tokens
from mainspring.api.generation import Generation, Job
from mainspring.api.routes import new_id
from mainspring.api.routes.models import resolve_model
from mainspring.api.schemas import AnthropicUsage, ContentBlockIn, MessageOut, MessagesPrompt, MessagesRequest
from mainspring.api.sse import EventStreamResponse, prime, sse_event
from mainspring.tool_calls import (ParsedCall, ToolCallStream, ToolChoice, ToolSpec, anthropic_tool_choice,
                                  call_schema, parse_answer, render_prompt)
from mainspring.engine.tokenizer import Tokenizer
from mainspring.engine.errors import InvalidRequestError
from mainspring.engine.outputs import RequestOutput
from mainspring.engine.params import SamplingParams

router = APIRouter()
ENDPOINT = "/v1/messages"
_SKIPPED = ("thinking", "redacted_thinking")  # earlier reasoning is not shown to the model again


def _block_text(content: str | list[dict[str, Any]] | None, where: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    texts = []
    for j, b in enumerate(content):
        if b.get("type") != "text" or not isinstance(b.get("text"), str):
            raise bad_request(f"{where}.content[{j}]: only text blocks are supported here, got {b.get('type')!r}")
        texts.append(b["text"])
    return "\n".join(texts)


def normalize_messages(body: MessagesPrompt) -> tuple[list[dict[str, Any]], str]:
    """Anthropic messages -> (normalized messages for `tools.template_messages`, assistant prefill)."""
    out: list[dict[str, Any]] = []
    if body.system:
        system = body.system if isinstance(body.system, str) else \
            _block_text([b.model_dump() for b in body.system], "system")
        out.append({"role": "system", "content": system})
    names_by_id: dict[str, str] = {}
    for i, m in enumerate(body.messages):
        blocks = [ContentBlockIn(type="text", text=m.content)] if isinstance(m.content, str) else m.content
        texts, calls, results = [], [], []
        for j, b in enumerate(blocks):
            where = f"messages.{i}.content.{j}"
            if b.type == "text":
                texts.append(b.text or "")
            elif b.type == "tool_use" and m.role == "assistant":
                names_by_id[b.id or ""] = b.name or ""
                calls.append({"id": b.id, "name": b.name, "arguments": b.input or {}})
            elif b.type == "tool_result" and m.role == "user":
                text = _block_text(b.content, where)
                results.append({"role": "tool", "tool_call_id": b.tool_use_id, "content":
                                f"Error: {text}" if b.is_error else text,
                                "name": names_by_id.get(b.tool_use_id or "", "")})
            elif b.type not in _SKIPPED:
                raise bad_request(f"{where}: content blocks of type {b.type!r} are not supported "
                                  f"in {m.role} messages by this text-only server")
        out += results  # Anthropic puts tool results first in the user turn that answers the calls
        if texts or calls or not results:
            msg: dict[str, Any] = {"role": m.role, "content": "\n".join(texts)}
            if calls:
                msg["tool_calls"] = calls
            out.append(msg)
    prefill = ""
    if out and out[-1]["role"] == "assistant" and not out[-1].get("tool_calls"):
        prefill = out.pop()["content"]
    return out, prefill


async def prompt_of(body: MessagesPrompt, tokenizer: Tokenizer) -> tuple[list[int], list[ToolSpec], ToolChoice]:
    """(prompt token ids, tools, tool choice) of a call: the same for /v1/messages and count_tokens."""
    for i, t in enumerate(body.tools or []):
        kind = (t.model_extra or {}).get("type")
        if kind not in (None, "custom"):  # server tools (web_search_..., code_execution_...) run at Anthropic
            raise bad_request(f"tools.{i}: server tools of type {kind!r} are not available on this server; "
                              "give client tools (name, description, input_schema)")
    tools = [ToolSpec(t.name, t.description or "", t.input_schema) for t in body.tools or []]
    choice = anthropic_tool_choice(body.tool_choice, tools)
    messages, prefill = normalize_messages(body)
    if not messages:
        raise bad_request("messages: give at least one user message")
    prompt_ids = await asyncio.to_thread(  # ~1 s per MB of prompt: never on the event loop
        lambda: tokenizer.encode(render_prompt(tokenizer, messages, tools, choice) + prefill))
    return prompt_ids, tools, choice


def _stop_reason(out: RequestOutput, calls: list[ParsedCall], stops: list[str]) -> tuple[str, str | None]:
    if any(c.partial is not None for c in calls):  # a forced call cut off mid-way
        return "max_tokens", None
    if calls:
        return "tool_use", None
    if out.finish_reason == "length":
        return "max_tokens", None
    if isinstance(out.stop_reason, str) and out.stop_reason in stops:
        return "stop_sequence", out.stop_reason
    return "end_turn", None


def _one_call(body: MessagesRequest) -> bool:
    return bool((body.tool_choice or {}).get("disable_parallel_tool_use"))


def _tool_block(c: ParsedCall) -> dict[str, Any]:
    return {"type": "tool_use", "id": c.id, "name": c.name, "input": c.arguments}


@router.post(ENDPOINT + "/count_tokens")
async def count_tokens(body: MessagesPrompt, request: Request) -> dict[str, int]:
    model = await resolve_model(request, body.model, fast=body.speed == "fast")
    prompt_ids, _, _ = await prompt_of(body, model.engine.tokenizer)
    return {"input_tokens": len(prompt_ids)}


@router.post(ENDPOINT)
async def create_message(body: MessagesRequest, request: Request) -> Any:
    model = await resolve_model(request, body.model, fast=body.speed == "fast")
    prompt_ids, tools, choice = await prompt_of(body, model.engine.tokenizer)
    max_tokens = fit_max_tokens(model.context_len(body), len(prompt_ids), body.max_tokens, "messages")
    stops = body.stop_sequences or []
    schema = body.output_schema
    if choice.forced:
        guided: dict[str, Any] = {"guided_json": call_schema(tools, choice)}
    else:
        guided = {"guided_json": schema} if schema is not None else {}
        if schema is not None:  # the answer is the structured output: nothing in it is a tool call
            choice = ToolChoice("none")
    try:
        params = SamplingParams(temperature=body.temperature, top_p=body.top_p or 1.0, top_k=body.top_k or 0,
                                max_tokens=max_tokens, stop=stops, **guided)
    except InvalidRequestError as e:
        raise from_engine_error(e, {"stop": "stop_sequences"}) from None
    gen = Generation(request, model, ENDPOINT, [Job(prompt_ids, params)], stream=body.stream, call_id=new_id("msg_"))
    await gen.begin()
    if body.stream:
        stream = await prime(gen.stream())
        return EventStreamResponse(_events(gen, stream, tools, choice, stops, _one_call(body)), on_close=gen.aclose)

    outputs = await gen.complete()
    if outputs is None:
        return JSONResponse(error_body(APIError(499, "client closed request"), True), status_code=499)
    out = outputs[0]
    text, calls = parse_answer(out.text, tools, choice, out.finish_reason, "toolu_")
    calls = calls[:1] if _one_call(body) else calls
    content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text or not calls else []
    reason, seq = _stop_reason(out, calls, stops)
    return MessageOut(id=gen.call_id, model=model.id, content=content + [_tool_block(c) for c in calls],
                      stop_reason=reason, stop_sequence=seq, usage=AnthropicUsage.of(gen.usage(), gen.model.tier))


async def _events(gen: Generation, stream: AsyncIterator, tools: list[ToolSpec], choice: ToolChoice,
                  stops: list[str], one_call: bool) -> AsyncIterator[str]:
    holder = ToolCallStream(tools, hold_all=choice.forced, prefix="toolu_", choice=choice) \
        if choice.mode != "none" else None
    index, text_open = 0, False

    def text_delta(text: str) -> list[str]:
        nonlocal text_open
        events = []
        if not text_open:
            events.append(sse_event("content_block_start", {"type": "content_block_start", "index": index,
                                                            "content_block": {"type": "text", "text": ""}}))
            text_open = True
        if text:
            events.append(sse_event("content_block_delta", {"type": "content_block_delta", "index": index,
                                                            "delta": {"type": "text_delta", "text": text}}))
        return events

    try:
        # message_start waits for the first engine output, which is when cached tokens are known
        first_usage = AnthropicUsage.of(gen.usage(), gen.model.tier).model_dump()
        yield sse_event("message_start", {"type": "message_start", "message": {
            "id": gen.call_id, "type": "message", "role": "assistant", "model": gen.model.id, "content": [],
            "stop_reason": None, "stop_sequence": None, "usage": first_usage}})
        async for _, out in stream:
            text = holder.feed(out.delta_text) if holder else out.delta_text
            if text:
                for e in text_delta(text):
                    yield e
            if not out.finished:
                continue
            calls: list[ParsedCall] = []
            if holder:
                rest, calls = holder.finish(out.finish_reason)
                calls = calls[:1] if one_call else calls
                if rest:
                    for e in text_delta(rest):
                        yield e
            if not text_open and not calls:  # an empty answer is still one (empty) text block
                for e in text_delta(""):
                    yield e
            if text_open:
                yield sse_event("content_block_stop", {"type": "content_block_stop", "index": index})
                index += 1
            for c in calls:
                block = {**_tool_block(c), "input": {}}  # the input arrives as JSON deltas, as Anthropic sends it
                yield sse_event("content_block_start", {"type": "content_block_start", "index": index,
                                                        "content_block": block})
                yield sse_event("content_block_delta", {"type": "content_block_delta", "index": index, "delta": {
                    "type": "input_json_delta", "partial_json": c.arguments_json}})
                yield sse_event("content_block_stop", {"type": "content_block_stop", "index": index})
                index += 1
            reason, seq = _stop_reason(out, calls, stops)
            yield sse_event("message_delta", {"type": "message_delta",
                                              "delta": {"stop_reason": reason, "stop_sequence": seq},
                                              "usage": AnthropicUsage.of(gen.usage(), gen.model.tier).model_dump()})
        yield sse_event("message_stop", {"type": "message_stop"})
    except Exception as e:  # headers are sent: report in-band with Anthropic's error event
        err = e if isinstance(e, APIError) else APIError(500, "the engine failed while generating this response")
        yield sse_event("error", error_body(err, True))

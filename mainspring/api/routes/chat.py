"""POST /v1/chat/completions: OpenAI chat, streamed or not, with n, logprobs, JSON output and tools."""

from __future__ import annotations

import asyncio
import json
from typing import Any, AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from mainspring.api.errors import APIError, bad_request, error_body
from mainspring.api.routes import (SYSTEM_FINGERPRINT, Generation, finite, choice_jobs, fit_max_tokens, new_id, now,
                                   sampling_params, vllm_guided)
from mainspring.api import upstream
from mainspring.api.routes.models import resolve_model
from mainspring.api.schemas import (ChatChoice, ChatChunkChoice, ChatCompletion, ChatCompletionChunk,
                                    ChatCompletionRequest, ChatDelta, ChatMessage, ChatMessageOut, ChoiceLogprobs,
                                    ContentPart, FunctionCallOut, TokenLogprobOut, ToolCallDelta, ToolCallOut,
                                    TopLogprobOut, UsageOut)
from mainspring.api.sse import DONE, EventStreamResponse, prime, sse_data
from mainspring.api.tools import (ParsedCall, ToolCallStream, ToolChoice, ToolSpec, call_schema, new_call_id,
                                  openai_tool_choice, parse_answer, template_messages)
from mainspring.billing.trace import segments_from_messages
from mainspring.engine.outputs import TokenLogprob
from mainspring.engine.tokenizer import Tokenizer

router = APIRouter()
ENDPOINT = "/v1/chat/completions"
_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool",
          "function": "tool"}


# ---- request -> prompt ------------------------------------------------------------------------------
def content_text(content: str | list[ContentPart] | None, where: str) -> str:
    """String content, or text parts joined by newlines; other part types are a 400 (text-only models)."""
    if content is None or isinstance(content, str):
        return content or ""
    texts = []
    for j, part in enumerate(content):
        if part.type not in ("text", "input_text") or part.text is None:
            raise bad_request(f"content parts of type {part.type!r} are not supported; this model reads text only",
                              param=f"{where}.content[{j}]")
        texts.append(part.text)
    return "\n".join(texts)


def normalize_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """OpenAI messages -> the normalized form `tools.template_messages` takes."""
    out: list[dict[str, Any]] = []
    names_by_id: dict[str, str] = {}
    for i, m in enumerate(messages):
        role = _ROLES.get(m.role)
        if role is None:
            raise bad_request(f"unknown role {m.role!r}; use system, developer, user, assistant or tool",
                              param=f"messages[{i}].role")
        msg: dict[str, Any] = {"role": role, "content": content_text(m.content, f"messages[{i}]")}
        if m.name:
            msg["name"] = m.name
        if role == "assistant" and m.tool_calls:
            msg["tool_calls"] = []
            for k, c in enumerate(m.tool_calls):
                args: Any = c.function.arguments
                if isinstance(args, str):
                    try:
                        args = json.loads(args) if args.strip() else {}
                    except ValueError:
                        raise bad_request("tool call arguments must be a JSON object",
                                          param=f"messages[{i}].tool_calls[{k}].function.arguments") from None
                call_id = c.id or new_call_id()
                names_by_id[call_id] = c.function.name
                msg["tool_calls"].append({"id": call_id, "name": c.function.name, "arguments": args})
        if role == "tool":
            msg["tool_call_id"] = m.tool_call_id
            msg["name"] = m.name or names_by_id.get(m.tool_call_id or "", "")
        out.append(msg)
    return out


def render_prompt(tokenizer: Tokenizer, messages: list[dict[str, Any]], tools: list[ToolSpec],
                  choice: ToolChoice) -> str:
    msgs, template_tools = template_messages(messages, tools, choice, tokenizer.chat_template)
    return tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tools=template_tools)


def _guided(body: ChatCompletionRequest, tools: list[ToolSpec], choice: ToolChoice) -> dict[str, Any]:
    extras = vllm_guided(body)
    rf = body.response_format
    if extras and (choice.forced or (rf is not None and rf.type != "text")):
        raise bad_request("give one output constraint: a forced tool_choice, response_format or vLLM's "
                          "guided_* / structured_outputs, not several", param=next(iter(extras)))
    if choice.forced:  # the tool call's own schema wins over response_format
        return {"guided_json": call_schema(tools, choice)}
    if extras:
        return extras
    if rf is None or rf.type == "text":
        return {}
    if rf.type == "json_object":
        return {"guided_json_object": True}
    if rf.json_schema is None:
        raise bad_request("response_format of type json_schema needs a json_schema object",
                          param="response_format.json_schema")
    schema = rf.json_schema.schema_
    return {"guided_json": schema} if schema else {"guided_json_object": True}


# fields of the SDK's request that would change the answer and that this text-only server cannot honour
_UNSUPPORTED = {"functions": "the legacy functions API is not supported; send tools and tool_choice",
                "function_call": "the legacy functions API is not supported; send tools and tool_choice",
                "audio": "audio output is not supported: this model writes text only",
                "web_search_options": "web search is not available on this server",
                "moderation": "moderation is not available on this server"}


def _check_supported(body: ChatCompletionRequest) -> None:
    for name, why in _UNSUPPORTED.items():
        if (body.model_extra or {}).get(name) is not None:
            raise bad_request(why, param=name)
    modalities = (body.model_extra or {}).get("modalities")
    if isinstance(modalities, list) and any(m != "text" for m in modalities):
        raise bad_request("only the text modality is supported: this model writes text only", param="modalities")


# ---- engine output -> response pieces ---------------------------------------------------------------
def chat_logprobs(lps: list[TokenLogprob], tokenizer: Tokenizer) -> ChoiceLogprobs:
    def top(t: Any) -> TopLogprobOut:
        return TopLogprobOut(token=t.token, logprob=finite(t.logprob), bytes=list(tokenizer.token_bytes(t.token_id)))

    return ChoiceLogprobs(content=[TokenLogprobOut(**top(lp).model_dump(), top_logprobs=[top(t) for t in lp.top])
                                   for lp in lps])


def _tool_calls_out(calls: list[ParsedCall]) -> list[ToolCallOut]:
    return [ToolCallOut(id=c.id, function=FunctionCallOut(name=c.name, arguments=c.arguments_json)) for c in calls]


def _finish_reason(calls: list[ParsedCall], engine_reason: str | None) -> str | None:
    # a forced call that max_tokens cut off is still a (partial) call, but the answer ended on "length"
    return "tool_calls" if calls and all(c.partial is None for c in calls) else engine_reason


@router.post(ENDPOINT)
async def create_chat_completion(body: ChatCompletionRequest, request: Request) -> Any:
    if upstream.serves(request, body.model):
        return await upstream.proxy(request, body, ENDPOINT)
    model = await resolve_model(request, body.model)
    _check_supported(body)
    tokenizer = model.engine.tokenizer
    tools = [ToolSpec(t.function.name, t.function.description or "",
                      t.function.parameters or {"type": "object", "properties": {}}) for t in body.tools or []]
    choice = openai_tool_choice(body.tool_choice, tools)
    prompt_ids = await asyncio.to_thread(  # ~1 s per MB of prompt: never on the event loop
        lambda: tokenizer.encode(render_prompt(tokenizer, normalize_messages(body.messages), tools, choice)))
    if getattr(request.app.state, "trace_recorder", None) is not None:  # counts and hashes only, no text
        request.state.trace_segments = segments_from_messages(normalize_messages(body.messages), tokenizer, tools)
    max_tokens = fit_max_tokens(model.context_len(body), len(prompt_ids),
                                body.max_completion_tokens or body.max_tokens, "messages",
                                "max_completion_tokens" if body.max_completion_tokens else "max_tokens")
    if body.top_logprobs and not body.logprobs:
        raise bad_request("top_logprobs needs logprobs set to true", param="top_logprobs")
    params = sampling_params(body, max_tokens=max_tokens, logprobs=(body.top_logprobs or 0) if body.logprobs else None,
                             **_guided(body, tools, choice))
    gen = Generation(request, model, ENDPOINT, choice_jobs(prompt_ids, params, body.n), stream=body.stream,
                     call_id=new_id("chatcmpl-"))
    await gen.begin()
    if body.stream:
        stream = await prime(gen.stream())
        return EventStreamResponse(_events(body, gen, stream, tools, choice, tokenizer), on_close=gen.aclose)

    outputs = await gen.complete()
    if outputs is None:  # the client left; nobody reads this
        return JSONResponse(error_body(APIError(499, "client closed request"), False), status_code=499)
    choices = []
    for i, out in enumerate(outputs):
        content, calls = parse_answer(out.text, tools, choice, out.finish_reason)
        if body.parallel_tool_calls is False:
            calls = calls[:1]
        choices.append(ChatChoice(
            index=i, message=ChatMessageOut(content=content, tool_calls=_tool_calls_out(calls) or None),
            logprobs=chat_logprobs(out.logprobs, tokenizer) if out.logprobs is not None else None,
            finish_reason=_finish_reason(calls, out.finish_reason)))
    return ChatCompletion(id=gen.call_id, created=now(), model=model.id, system_fingerprint=SYSTEM_FINGERPRINT,
                          choices=choices, usage=UsageOut.of(gen.usage()))


async def _events(body: ChatCompletionRequest, gen: Generation, stream: AsyncIterator, tools: list[ToolSpec],
                  choice: ToolChoice, tokenizer: Tokenizer) -> AsyncIterator[str]:
    created = now()

    def chunk(choices: list[ChatChunkChoice], usage: UsageOut | None = None) -> str:
        return sse_data(ChatCompletionChunk(id=gen.call_id, created=created, model=gen.model.id,
                                            system_fingerprint=SYSTEM_FINGERPRINT, choices=choices, usage=usage))

    n = len(gen.jobs)
    holders = [ToolCallStream(tools, hold_all=choice.forced, choice=choice) if choice.mode != "none" else None
               for _ in range(n)]
    lp_sent = [0] * n
    try:
        for i in range(n):
            yield chunk([ChatChunkChoice(index=i, delta=ChatDelta(role="assistant", content=""))])
        async for i, out in stream:
            text = holders[i].feed(out.delta_text) if holders[i] else out.delta_text
            new_lps = out.logprobs[lp_sent[i]:] if out.logprobs is not None else []
            lp_sent[i] += len(new_lps)
            if text or new_lps:
                yield chunk([ChatChunkChoice(index=i, delta=ChatDelta(content=text),
                                             logprobs=chat_logprobs(new_lps, tokenizer) if new_lps else None)])
            if not out.finished:
                continue
            calls: list[ParsedCall] = []
            if holders[i]:
                rest, calls = holders[i].finish(out.finish_reason)
                if body.parallel_tool_calls is False:
                    calls = calls[:1]
                if rest:
                    yield chunk([ChatChunkChoice(index=i, delta=ChatDelta(content=rest))])
                if calls:
                    deltas = [ToolCallDelta(index=k, id=c.id, type="function", function=f.function)
                              for k, (c, f) in enumerate(zip(calls, _tool_calls_out(calls)))]
                    yield chunk([ChatChunkChoice(index=i, delta=ChatDelta(tool_calls=deltas))])
            yield chunk([ChatChunkChoice(index=i, delta=ChatDelta(),
                                         finish_reason=_finish_reason(calls, out.finish_reason))])
        if body.include_usage:
            yield chunk([], UsageOut.of(gen.usage()))
    except Exception as e:  # headers are sent: report in-band, as OpenAI does, then end the stream
        err = e if isinstance(e, APIError) else APIError(500, "the engine failed while generating this response")
        yield sse_data(error_body(err, False))
    yield DONE

"""POST /v1/chat/completions: OpenAI chat, streamed or not, with n, logprobs, JSON output and tools."""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from mainspring.api.errors import APIError, bad_request, error_body
from mainspring.api.engine_params import fit_max_tokens, sampling_params, vllm_guided
from mainspring.api.generation import SYSTEM_FINGERPRINT, Generation, choice_jobs, finite, now
from mainspring.api.routes import new_id
from mainspring.api import upstream
from mainspring.api.routes.models import resolve_model
from mainspring.api.schemas import (ChatChoice, ChatChunkChoice, ChatCompletion, ChatCompletionChunk,
                                    ChatCompletionRequest, ChatDelta, ChatMessage, ChatMessageOut, ChoiceLogprobs,
                                    FunctionCallOut, TokenLogprobOut, ToolCallDelta, ToolCallOut,
                                    TopLogprobOut, UsageOut)
from mainspring.api.sse import DONE, EventStreamResponse, prime, sse_data
from mainspring.tool_calls import (ParsedCall, ToolCallStream, ToolChoice, ToolSpec, finish_reason, guided_decoding,
                                  openai_messages, openai_tool_choice, parse_answer, render_prompt)
from mainspring.billing.trace import segments_from_messages
from mainspring.engine.outputs import TokenLogprob
from mainspring.engine.tokenizer import Tokenizer

router = APIRouter()
ENDPOINT = "/v1/chat/completions"


# ---- request -> prompt ------------------------------------------------------------------------------
def normalize_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """The request's messages as `tool_calls` normalizes them (tool call arguments as objects)."""
    return openai_messages([m.model_dump(exclude_none=True) for m in messages])


def _guided(body: ChatCompletionRequest, tools: list[ToolSpec], choice: ToolChoice) -> dict[str, Any]:
    rf = body.response_format
    if rf is not None and rf.type == "json_schema" and rf.json_schema is None:
        raise bad_request("response_format of type json_schema needs a json_schema object",
                          param="response_format.json_schema")
    return guided_decoding(tools, choice, rf.type if rf is not None else "text",
                           rf.json_schema.schema_ if rf is not None and rf.json_schema is not None else None,
                           vllm_guided(body))


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
            finish_reason=finish_reason(calls, out.finish_reason)))
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
                                         finish_reason=finish_reason(calls, out.finish_reason))])
        if body.include_usage:
            yield chunk([], UsageOut.of(gen.usage()))
    except Exception as e:  # headers are sent: report in-band, as OpenAI does, then end the stream
        err = e if isinstance(e, APIError) else APIError(500, "the engine failed while generating this response")
        yield sse_data(error_body(err, False))
    yield DONE

"""POST /v1/responses (OpenAI's Responses API), streamed or not, and the responses it stores.

A response is one model turn over the same engine, tools, constrained decoding, hooks and ledger as
/v1/chat/completions: input items become chat messages, the model's text becomes a message item and the
tool calls parsed out of it function_call items. With `store` (OpenAI's default) the response, its input
items and its output are kept in the database, so it can be retrieved, listed, deleted and continued
(`previous_response_id` prepends its input and output). A stored response belongs to the project of
the key that created it: any key of that project sees it, another project's key gets a 404.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, AsyncIterator

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse
from sqlalchemy import select

from mainspring.api import upstream
from mainspring.api.errors import APIError, bad_request, error_body, from_engine_error
from mainspring.api.engine_params import fit_max_tokens, sampling_params
from mainspring.api.generation import Generation, choice_jobs, now
from mainspring.api.routes import new_id
from mainspring.api.routes.models import resolve_model
from mainspring.api.routes.responses_items import (call_item, conversation, input_items, message_item, output_items,
                                                   response_object, usage_object)
from mainspring.api.routes.responses_schemas import (ResponseCreateRequest, check_supported, function_tools, guided,
                                                     text_echo, tool_choice)
from mainspring.api.sse import EventStreamResponse, prime, sse_event
from mainspring.tool_calls import ParsedCall, ToolCallStream, ToolChoice, ToolSpec, parse_answer, render_prompt
from mainspring.billing.trace import segments_from_messages
from mainspring.engine.errors import InvalidRequestError
from mainspring.store.db import session
from mainspring.store.tables import ResponseRow

router = APIRouter()
ENDPOINT = "/v1/responses"


# ---- ownership -------------------------------------------------------------------------------------------
def _db(request: Request) -> Any:
    return request.app.state.economics.db


def _visible(principal: Any) -> Any:
    pid = principal.project_id if principal is not None else None
    return ResponseRow.project_id == pid if pid is not None else ResponseRow.project_id.is_(None)


def _get_owned(s: Any, resp_id: str, principal: Any, param: str = "response_id") -> ResponseRow:
    row = s.scalar(select(ResponseRow).where(ResponseRow.id == resp_id, _visible(principal)))
    if row is None:  # another project's response is as absent as one that never was
        raise APIError(404, f"Response with id '{resp_id}' not found.", param=param, code="response_not_found")
    return row


async def _load(request: Request, resp_id: str, param: str = "response_id") -> ResponseRow:
    def get() -> ResponseRow:
        with session(_db(request), readonly=True) as s:
            return _get_owned(s, resp_id, request.state.principal, param)

    return await asyncio.to_thread(get)


def _stored_object(row: ResponseRow) -> dict[str, Any]:
    return response_object(row.id, int(row.created_at.timestamp()), json.loads(row.request_json), row.status,
                           json.loads(row.output_json), json.loads(row.usage_json))


# ---- one turn --------------------------------------------------------------------------------------------
@dataclass
class _Turn:
    """What a call needs after the engine: its parameters as echoed, and what to store."""

    request: Request
    gen: Generation
    echo: dict[str, Any]
    items: list[dict[str, Any]]  # every input item the model saw
    tools: list[ToolSpec]
    choice: ToolChoice
    store: bool
    parallel: bool
    created_at: int = field(default_factory=now)

    def calls(self, calls: list[ParsedCall]) -> list[ParsedCall]:
        return calls if self.parallel else calls[:1]  # parallel_tool_calls false: at most one call per turn

    def snapshot(self, status: str, output: list[dict[str, Any]], usage: bool = False) -> dict[str, Any]:
        return response_object(self.gen.call_id, self.created_at, self.echo, status, output,
                               usage_object(self.gen.usage()) if usage else None)

    async def finish(self, status: str, output: list[dict[str, Any]]) -> dict[str, Any]:
        """The final response object, stored first when the request asked for it."""
        self.echo["completed_at"] = now()
        resp = self.snapshot(status, output, usage=True)
        if self.store:
            principal = self.request.state.principal
            row = ResponseRow(id=resp["id"], project_id=principal.project_id if principal is not None else None,
                              api_key_id=principal.id if principal is not None else None, model=resp["model"],
                              status=status, previous_response_id=self.echo["previous_response_id"],
                              request_json=json.dumps(self.echo), input_json=json.dumps(self.items),
                              output_json=json.dumps(output), usage_json=json.dumps(resp["usage"]),
                              created_at=datetime.fromtimestamp(self.created_at, timezone.utc))

            def insert() -> None:
                with session(_db(self.request)) as s:
                    s.add(row)

            await asyncio.to_thread(insert)
        return resp


def _status(finish_reason: str | None) -> str:
    return "incomplete" if finish_reason == "length" else "completed"


def _echo(body: ResponseCreateRequest, model_id: str, tools: list[dict[str, Any]]) -> dict[str, Any]:
    """The request's parameters as the response object reports them (OpenAI's defaults filled in)."""
    return {"model": model_id, "instructions": body.instructions, "max_output_tokens": body.max_output_tokens,
            "temperature": 1.0 if body.temperature is None else body.temperature,
            "top_p": 1.0 if body.top_p is None else body.top_p, "tools": tools,
            "tool_choice": "auto" if body.tool_choice is None else body.tool_choice, "text": text_echo(body.text),
            "parallel_tool_calls": body.parallel_tool_calls is not False,
            "previous_response_id": body.previous_response_id, "metadata": body.metadata or {}, "user": body.user,
            "store": body.store is not False, "reasoning": {"effort": None, "summary": None},
            "truncation": "disabled", "background": False, "service_tier": "default", "top_logprobs": 0,
            "max_tool_calls": body.max_tool_calls, "safety_identifier": body.safety_identifier,
            "prompt_cache_key": body.prompt_cache_key}


@router.post(ENDPOINT)
async def create_response(body: ResponseCreateRequest, request: Request) -> Any:
    check_supported(body)
    if upstream.serves(request, body.model):
        raise bad_request(f"the model {body.model!r} is served by an upstream provider, which this server relays "
                          "on /v1/chat/completions only; /v1/responses serves this server's own models",
                          param="model", code="unsupported_model")
    model = await resolve_model(request, body.model)
    tools, tools_echo = function_tools(body.tools)
    choice, usable = tool_choice(body.tool_choice, tools)
    items = input_items(body.input)
    if body.previous_response_id is not None:
        prev = await _load(request, body.previous_response_id, "previous_response_id")
        items = json.loads(prev.input_json) + json.loads(prev.output_json) + items
    if not items:
        raise APIError(400, "missing required parameter: 'input'", param="input", code="missing_required_parameter")
    # instructions are this turn's only: a previous response's are not carried over, as on OpenAI
    messages = conversation(items, body.instructions)
    tokenizer = model.engine.tokenizer
    prompt_ids = await asyncio.to_thread(  # long prompts take a while to render and encode: not on the loop
        lambda: tokenizer.encode(render_prompt(tokenizer, messages, usable, choice)))
    if getattr(request.app.state, "trace_recorder", None) is not None:  # counts and hashes only, no text
        request.state.trace_segments = segments_from_messages(messages, tokenizer, usable)
    max_tokens = fit_max_tokens(model.context_len(body), len(prompt_ids), body.max_output_tokens, "input",
                                "max_output_tokens")
    params = sampling_params(body.sampling(), max_tokens=max_tokens, **guided(body, usable, choice))
    gen = Generation(request, model, ENDPOINT, choice_jobs(prompt_ids, params, 1), stream=body.stream,
                     call_id=new_id("resp_"))
    turn = _Turn(request, gen, _echo(body, model.id, tools_echo), items, usable, choice, body.store is not False,
                 body.parallel_tool_calls is not False)
    await gen.begin()
    try:  # the grammar compiles when the engine admits the request: name the schema that does not
        if body.stream:
            stream = await prime(gen.stream())
            return EventStreamResponse(_events(turn, stream), on_close=gen.aclose)
        outputs = await gen.complete()
    except InvalidRequestError as e:
        err = from_engine_error(e)
        fmt = body.text.format if body.text is not None else None
        if err.param is None and "schema" in err.message and (choice.forced or fmt and fmt.type == "json_schema"):
            err.param = "tools" if choice.forced else "text.format.schema"
        raise err from None
    if outputs is None:  # the client left; nobody reads this
        return JSONResponse(error_body(APIError(499, "client closed request"), False), status_code=499)
    out = outputs[0]
    content, calls = parse_answer(out.text, usable, choice, out.finish_reason)
    status = _status(out.finish_reason)
    return await turn.finish(status, output_items(content, turn.calls(calls), status))


# ---- streaming -------------------------------------------------------------------------------------------
class _Events:
    """Typed events with their sequence numbers, and the output items announced so far."""

    def __init__(self, turn: _Turn) -> None:
        self.turn, self.seq = turn, 0
        self.output: list[dict[str, Any]] = []
        self.message: dict[str, Any] | None = None  # the open message item
        self.text = ""

    def event(self, kind: str, **fields: Any) -> str:
        self.seq += 1
        return sse_event(kind, {"type": kind, "sequence_number": self.seq - 1, **fields})

    def text_delta(self, delta: str) -> list[str]:
        out = []
        if self.message is None:
            self.message = message_item(new_id("msg_"), None, "in_progress")
            self.output.append(self.message)
            out.append(self.event("response.output_item.added", output_index=0, item=self.message))
            out.append(self.event("response.content_part.added", item_id=self.message["id"], output_index=0,
                                  content_index=0, part=_part("")))
        if delta:
            self.text += delta
            out.append(self.event("response.output_text.delta", item_id=self.message["id"], output_index=0,
                                  content_index=0, delta=delta, logprobs=[]))
        return out

    def close_message(self, status: str) -> list[str]:
        item_id = self.message["id"]  # type: ignore[index]
        done = message_item(item_id, self.text, status)
        self.output[0] = done
        return [self.event("response.output_text.done", item_id=item_id, output_index=0, content_index=0,
                           text=self.text, logprobs=[]),
                self.event("response.content_part.done", item_id=item_id, output_index=0, content_index=0,
                           part=_part(self.text)),
                self.event("response.output_item.done", output_index=0, item=done)]

    def call(self, call: ParsedCall) -> list[str]:
        index, done = len(self.output), call_item(call)
        self.output.append(done)
        return [self.event("response.output_item.added", output_index=index,
                           item=call_item(call, "in_progress", arguments="")),
                self.event("response.function_call_arguments.delta", item_id=done["id"], output_index=index,
                           delta=done["arguments"]),
                self.event("response.function_call_arguments.done", item_id=done["id"], output_index=index,
                           arguments=done["arguments"]),
                self.event("response.output_item.done", output_index=index, item=done)]


def _part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


async def _events(turn: _Turn, stream: AsyncIterator) -> AsyncIterator[str]:
    ev = _Events(turn)
    holder = (ToolCallStream(turn.tools, hold_all=turn.choice.forced, choice=turn.choice)
              if turn.choice.mode != "none" else None)
    try:
        yield ev.event("response.created", response=turn.snapshot("in_progress", []))
        yield ev.event("response.in_progress", response=turn.snapshot("in_progress", []))
        finish_reason = None
        async for _, out in stream:
            delta = holder.feed(out.delta_text) if holder else out.delta_text
            if delta:
                for e in ev.text_delta(delta):
                    yield e
            if out.finished:
                finish_reason = out.finish_reason
        rest, calls = holder.finish(finish_reason) if holder else ("", [])
        calls = turn.calls(calls)
        status = _status(finish_reason)
        if rest or (ev.message is None and not calls):  # text held back, or an empty answer: still a message
            for e in ev.text_delta(rest):
                yield e
        if ev.message is not None:
            for e in ev.close_message(status):
                yield e
        for c in calls:
            for e in ev.call(c):
                yield e
        resp = await turn.finish(status, ev.output)
        yield ev.event("response.completed" if status == "completed" else "response.incomplete", response=resp)
    except Exception as e:  # headers are sent: report in-band, as OpenAI does, then end the stream
        err = e if isinstance(e, APIError) else APIError(500, "the engine failed while generating this response")
        yield ev.event("error", code=err.code or err.type, message=err.message, param=err.param)
        failed = turn.snapshot("failed", ev.output)
        failed["error"] = {"code": "server_error" if err.status >= 500 else (err.code or "invalid_request"),
                           "message": err.message}
        yield ev.event("response.failed", response=failed)


# ---- stored responses ------------------------------------------------------------------------------------
@router.get(ENDPOINT + "/{response_id}")
async def retrieve_response(response_id: str, request: Request, stream: bool = False) -> dict[str, Any]:
    if stream:  # OpenAI replays a background response's events; there are none here
        raise bad_request("stream=true is for background responses, which this server does not run",
                          param="stream", code="unsupported_parameter")
    return _stored_object(await _load(request, response_id))


@router.delete(ENDPOINT + "/{response_id}")
async def delete_response(response_id: str, request: Request) -> dict[str, Any]:
    def delete() -> None:
        with session(_db(request)) as s:
            s.delete(_get_owned(s, response_id, request.state.principal))

    await asyncio.to_thread(delete)
    return {"id": response_id, "object": "response", "deleted": True}


@router.get(ENDPOINT + "/{response_id}/input_items")
async def list_input_items(response_id: str, request: Request, after: str | None = None,
                           limit: int = Query(20, ge=1, le=100),
                           order: str = Query("desc", pattern="^(asc|desc)$")) -> dict[str, Any]:
    items = json.loads((await _load(request, response_id)).input_json)
    if order == "desc":
        items.reverse()
    if after is not None:
        ids = [i["id"] for i in items]
        if after not in ids:
            raise bad_request(f"no input item with id {after!r} in response {response_id}", param="after")
        items = items[ids.index(after) + 1:]
    page = items[:limit]
    return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None, "has_more": len(items) > limit}

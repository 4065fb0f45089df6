"""Items of the Responses API: input items in, the model's turn out, and the response object.

Every item is kept in one canonical shape, the one GET /v1/responses/{id}/input_items returns: messages
with a list of text parts (input_text, or output_text for the assistant), function_call items with their
arguments as a JSON string, function_call_output items with a string output; each with an id and a
status. A stored response's input and output items are canonical, so continuing from it
(previous_response_id) is prepending them.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from mainspring.api.errors import bad_request
from mainspring.api.routes import new_id
from mainspring.api.routes.responses_schemas import field_error
from mainspring.api.schemas import ContentPart
from mainspring.tool_calls import ParsedCall
from mainspring.engine.outputs import Usage

_LENIENT = ConfigDict(extra="allow")
_ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}
_TEXT_PARTS = ("input_text", "output_text", "text")


class _Message(BaseModel):
    model_config = _LENIENT
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[ContentPart]
    id: str | None = None


class _FunctionCall(BaseModel):
    model_config = _LENIENT
    type: Literal["function_call"]
    call_id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    arguments: str
    id: str | None = None


class _FunctionCallOutput(BaseModel):
    model_config = _LENIENT
    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1)
    output: str | list[ContentPart]
    id: str | None = None


_KINDS: dict[str, type[BaseModel]] = {"message": _Message, "function_call": _FunctionCall,
                                      "function_call_output": _FunctionCallOutput}


# ---- input -> canonical items ------------------------------------------------------------------------------
def _texts(parts: str | list[ContentPart], where: str) -> list[str]:
    if isinstance(parts, str):
        return [parts]
    texts = []
    for j, part in enumerate(parts):
        if part.type not in _TEXT_PARTS or part.text is None:
            raise bad_request(f"content parts of type {part.type!r} are not supported; this model reads text only",
                              param=f"{where}[{j}]", code="unsupported_content")
        texts.append(part.text)
    return texts


def input_items(raw: str | list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """The request's `input` as canonical items; an item type this server cannot use is a 400 naming it."""
    if raw is None:
        return []
    if isinstance(raw, str):
        raw = [{"type": "message", "role": "user", "content": raw}]
    items = []
    for i, item in enumerate(raw):
        kind = item.get("type", "message")
        model = _KINDS.get(kind) if isinstance(kind, str) else None
        if model is None:
            raise bad_request(f"input items of type {json.dumps(kind)} are not supported by this server; use "
                              "message, function_call and function_call_output items", param=f"input[{i}].type",
                              code="unsupported_item")
        try:
            parsed: Any = model.model_validate(item)
        except ValidationError as exc:
            raise field_error(exc, "input", i) from None
        if isinstance(parsed, _Message):
            part = "output_text" if parsed.role == "assistant" else "input_text"
            content = [{"type": part, "text": t, **({"annotations": []} if part == "output_text" else {})}
                       for t in _texts(parsed.content, f"input[{i}].content")]
            items.append({"id": parsed.id or new_id("msg_"), "type": "message", "role": parsed.role,
                          "content": content, "status": "completed"})
        elif isinstance(parsed, _FunctionCall):
            try:
                args = json.loads(parsed.arguments) if parsed.arguments.strip() else {}
            except ValueError:
                args = None
            if not isinstance(args, dict):
                raise bad_request("function_call arguments must be a JSON object, as a string",
                                  param=f"input[{i}].arguments")
            items.append({"id": parsed.id or new_id("fc_"), "type": "function_call", "call_id": parsed.call_id,
                          "name": parsed.name, "arguments": parsed.arguments, "status": "completed"})
        else:
            output = "\n".join(_texts(parsed.output, f"input[{i}].output"))
            items.append({"id": parsed.id or new_id("fco_"), "type": "function_call_output",
                          "call_id": parsed.call_id, "output": output, "status": "completed"})
    return items


# ---- canonical items -> chat messages ------------------------------------------------------------------------
def conversation(items: list[dict[str, Any]], instructions: str | None) -> list[dict[str, Any]]:
    """Canonical items as the normalized messages `tools.template_messages` takes: function calls join the
    assistant turn before them, their outputs become tool turns (named by the call they answer)."""
    msgs: list[dict[str, Any]] = [{"role": "system", "content": instructions}] if instructions else []
    names: dict[str, str] = {}
    for item in items:
        if item["type"] == "message":
            msgs.append({"role": _ROLES[item["role"]], "content": "\n".join(p["text"] for p in item["content"])})
        elif item["type"] == "function_call":
            names[item["call_id"]] = item["name"]
            call = {"id": item["call_id"], "name": item["name"],
                    "arguments": json.loads(item["arguments"]) if item["arguments"].strip() else {}}
            if msgs and msgs[-1]["role"] == "assistant":
                msgs[-1].setdefault("tool_calls", []).append(call)
            else:
                msgs.append({"role": "assistant", "content": "", "tool_calls": [call]})
        else:
            msgs.append({"role": "tool", "tool_call_id": item["call_id"], "name": names.get(item["call_id"], ""),
                         "content": item["output"]})
    return msgs


# ---- the model's turn -> output items ------------------------------------------------------------------------
def message_item(item_id: str, text: str | None, status: str) -> dict[str, Any]:
    content = [] if text is None else [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
    return {"id": item_id, "type": "message", "role": "assistant", "status": status, "content": content}


def call_item(call: ParsedCall, status: str | None = None, arguments: str | None = None) -> dict[str, Any]:
    """A function_call item; one that max_output_tokens cut off is "incomplete", with the arguments written."""
    return {"id": "fc_" + call.id.removeprefix("call_"), "type": "function_call", "call_id": call.id,
            "name": call.name, "arguments": call.arguments_json if arguments is None else arguments,
            "status": status or ("incomplete" if call.partial is not None else "completed")}


def output_items(content: str | None, calls: list[ParsedCall], status: str) -> list[dict[str, Any]]:
    """A message when there is text (or nothing at all), then one function_call item per call."""
    out = [message_item(new_id("msg_"), content or "", status)] if content or not calls else []
    return out + [call_item(c) for c in calls]


def usage_object(u: Usage) -> dict[str, Any]:
    return {"input_tokens": u.prompt_tokens,
            "input_tokens_details": {"cached_tokens": u.cached_tokens, "cache_write_tokens": 0},
            "output_tokens": u.completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": u.total_tokens}


def response_object(resp_id: str, created_at: int, echo: dict[str, Any], status: str,
                    output: list[dict[str, Any]], usage: dict[str, Any] | None) -> dict[str, Any]:
    """The `response` object; `echo` holds the request's parameters as the response reports them (and
    `completed_at`, once it is known)."""
    return {"id": resp_id, "object": "response", "created_at": created_at, "status": status, "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "completed_at": None, **echo, "output": output, "usage": usage}

"""The JSON schema a forced tool call must match, for guided decoding.

When a call is required ("required", a named tool, Anthropic "any"/"tool"), the output is
constrained to `{"name": <a tool name>, "arguments": <that tool's parameters>}`, so even a 135M
model produces a valid call.
"""

from __future__ import annotations

from typing import Any

from mainspring.engine.errors import InvalidRequestError
from mainspring.engine.json_schema import prepare_schema
from mainspring.tool_calls.normalize import ToolChoice, ToolSpec

_SCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_ONE = ("items", "additionalProperties", "not", "if", "then", "else", "contains")


def _closed(schema: Any) -> Any:
    """Every object schema that lists its properties but says nothing of others, nested ones and
    $defs included, gets additionalProperties false (what OpenAI's strict mode requires): otherwise
    the grammar lets a small model invent keys until max_tokens runs out."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in _SCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: _closed(sub) for name, sub in out[key].items()}
    for key in _SCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [_closed(sub) for sub in out[key]]
    for key in _SCHEMA_ONE:
        if isinstance(out.get(key), dict):
            out[key] = _closed(out[key])
    if "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def call_schema(tools: list[ToolSpec], choice: ToolChoice) -> dict[str, Any]:
    """The JSON schema a forced call must match: one tool's name with that tool's own arguments.

    Each tool's parameters move under /properties/arguments of the wrapper, so their local $refs
    (Pydantic's "#/$defs/Model") are rebased there by `prepare_schema`."""
    chosen = [t for t in tools if choice.mode != "named" or t.name == choice.name]

    def one(t: ToolSpec, at: str) -> dict[str, Any]:
        try:
            arguments = prepare_schema(_closed(t.parameters), at=f"{at}/properties/arguments")
        except InvalidRequestError as e:
            raise InvalidRequestError(f"tool {t.name!r}: {e}", param="tools") from None
        return {"type": "object", "properties": {"name": {"const": t.name}, "arguments": arguments},
                "required": ["name", "arguments"], "additionalProperties": False}

    return one(chosen[0], "") if len(chosen) == 1 else {"anyOf": [one(t, f"/anyOf/{i}") for i, t in enumerate(chosen)]}


def guided_decoding(tools: list[ToolSpec], choice: ToolChoice, fmt: str = "text", schema: dict[str, Any] | None = None,
                    extras: dict[str, Any] | None = None, fmt_param: str = "response_format") -> dict[str, Any]:
    """SamplingParams' guided fields for the one output constraint a request may set: a forced call
    (its schema wins over the format), vLLM's guided_* extras, or the response format `fmt` ("text",
    "json_object", or "json_schema" with `schema`; an empty schema means any object)."""
    if extras and (choice.forced or fmt != "text"):
        raise InvalidRequestError(f"give one output constraint: a forced tool_choice, {fmt_param} or vLLM's "
                                  "guided_* / structured_outputs, not several", param=next(iter(extras)))
    if choice.forced:
        return {"guided_json": call_schema(tools, choice)}
    if extras:
        return dict(extras)
    if fmt == "json_schema" and schema:
        return {"guided_json": schema}
    if fmt in ("json_object", "json_schema"):
        return {"guided_json_object": True}
    if fmt != "text":
        raise InvalidRequestError(f"unsupported {fmt_param} type {fmt!r}", param=f"{fmt_param}.type")
    return {}

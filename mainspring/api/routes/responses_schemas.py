"""The request of POST /v1/responses, and what of it this server honours.

OpenAI's Responses API rejects parameters it does not know, so this one does too: a field the server
cannot honour is a 400 naming it, never silently dropped. Fields that change nothing for a local,
non-reasoning model (metadata, user, service_tier, prompt_cache_key, ...) are accepted and echoed, as
OpenAI accepts them for every model. Mainspring's sampling extras of the other routes (seed, stop,
top_k, min_p, the KV policy fields, ...) are accepted too: the SDK sends them through `extra_body`.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from mainspring.api.errors import APIError, _validation_error, bad_request
from mainspring.api.engine_params import vllm_guided
from mainspring.api.schemas import SamplingFields
from mainspring.tool_calls import ToolChoice, ToolSpec, guided_decoding, openai_tool_choice

_LENIENT = ConfigDict(extra="allow", populate_by_name=True)
# `include` values with nothing to add here: a model without reasoning has no encrypted reasoning to return
_HARMLESS_INCLUDES = {"reasoning.encrypted_content"}
_HOSTED_TOOL_CHOICES = {"file_search", "web_search", "web_search_preview", "computer", "computer_use_preview",
                        "code_interpreter", "image_generation", "mcp", "custom", "shell", "apply_patch"}


class TextFormat(BaseModel):
    model_config = _LENIENT
    type: Literal["text", "json_object", "json_schema"] = "text"
    name: str | None = Field(None, min_length=1, max_length=64)
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class TextConfig(BaseModel):
    model_config = _LENIENT
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class FunctionTool(BaseModel):
    """Responses' function tool is flat: {"type": "function", "name", "parameters", "strict"}."""

    model_config = _LENIENT
    type: Literal["function"]
    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ResponseCreateRequest(SamplingFields):
    input: str | list[dict[str, Any]] | None = None
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)  # type: ignore[assignment]  # null: the default
    top_p: float | None = Field(None, gt=0.0, le=1.0)  # type: ignore[assignment]
    tools: list[dict[str, Any]] | None = None  # checked in function_tools, to name the bad tool
    tool_choice: Any = None
    text: TextConfig | None = None
    parallel_tool_calls: bool | None = None
    metadata: dict[str, str] | None = Field(None, max_length=16)
    store: bool | None = None
    previous_response_id: str | None = None
    reasoning: dict[str, Any] | None = None
    include: list[str] | None = None
    truncation: Literal["auto", "disabled"] | None = None
    background: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    max_tool_calls: int | None = Field(None, ge=1)  # counts built-in tool calls, of which there are none here
    service_tier: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None

    def sampling(self) -> SamplingFields:
        """The fields `sampling_params` reads, with OpenAI's defaults where the request sent null."""
        return self.model_copy(update={"temperature": 1.0 if self.temperature is None else self.temperature,
                                       "top_p": 1.0 if self.top_p is None else self.top_p})


def check_supported(body: ResponseCreateRequest) -> None:
    """400 for every parameter this server would otherwise have to ignore."""
    if body.model_extra:
        name = sorted(body.model_extra)[0]
        raise bad_request(f"Unsupported parameter: '{name}' is not supported by this server's Responses API",
                          param=name, code="unsupported_parameter")
    if body.n != 1:
        raise bad_request("n is not a Responses API parameter: a response has one output", param="n")
    if body.background:
        raise bad_request("background responses are not supported by this server; send background=false",
                          param="background", code="unsupported_parameter")
    for key in ("effort", "summary", "generate_summary"):
        if (body.reasoning or {}).get(key) is not None:  # what OpenAI answers for a model without reasoning
            raise bad_request(f"Unsupported parameter: 'reasoning.{key}' is not supported with this model",
                              param=f"reasoning.{key}", code="unsupported_parameter")
    for i, value in enumerate(body.include or []):
        if value not in _HARMLESS_INCLUDES:
            raise bad_request(f"include value {value!r} is not supported by this server", param=f"include[{i}]",
                              code="unsupported_value")
    if body.truncation == "auto":
        raise bad_request("truncation 'auto' is not supported: this server does not drop input items; "
                          "send truncation 'disabled'", param="truncation", code="unsupported_value")
    if body.top_logprobs:
        raise bad_request("top_logprobs is not supported by this server's Responses API", param="top_logprobs",
                          code="unsupported_parameter")
    if body.text is not None and body.text.verbosity not in (None, "medium"):
        raise bad_request(f"Unsupported value: text.verbosity {body.text.verbosity!r} is not supported with this "
                          "model; supported values are: 'medium'", param="text.verbosity", code="unsupported_value")


def field_error(exc: ValidationError, *loc: Any) -> APIError:
    """A part of the body validated on its own (a tool, an input item) as the 400 the whole body would get."""
    return _validation_error(RequestValidationError(
        [{**e, "loc": ("body", *loc, *e["loc"])} for e in exc.errors(include_url=False)]))


def function_tools(raw: list[dict[str, Any]] | None) -> tuple[list[ToolSpec], list[dict[str, Any]]]:
    """(the tools as ToolSpecs, as the response echoes them); a built-in tool is a 400 naming it."""
    specs, echo = [], []
    for i, t in enumerate(raw or []):
        kind = t.get("type")
        if kind != "function":
            raise bad_request(f"tools[{i}] is a built-in tool of type {json.dumps(kind)}, which this server does not "
                              'run; only function tools ({"type": "function", "name", "parameters"}) are supported',
                              param=f"tools[{i}].type", code="unsupported_tool")
        try:
            tool = FunctionTool.model_validate(t)
        except ValidationError as exc:
            raise field_error(exc, "tools", i) from None
        params = tool.parameters or {"type": "object", "properties": {}}
        specs.append(ToolSpec(tool.name, tool.description or "", params))
        # strict defaults to true on the Responses API (it is false on chat completions)
        echo.append({"type": "function", "name": tool.name, "description": tool.description, "parameters": params,
                     "strict": True if tool.strict is None else tool.strict})
    if len({t.name for t in specs}) != len(specs):
        raise bad_request("tool names must be unique", param="tools")
    return specs, echo


def tool_choice(raw: Any, tools: list[ToolSpec]) -> tuple[ToolChoice, list[ToolSpec]]:
    """(the choice, the tools it leaves) of Responses' tool_choice: "none" | "auto" | "required",
    {"type": "function", "name"}, or {"type": "allowed_tools", "mode", "tools"}."""
    if raw is None or isinstance(raw, str):
        return openai_tool_choice(raw, tools), tools
    kind = raw.get("type") if isinstance(raw, dict) else None
    if kind == "function" and isinstance(raw.get("name"), str):
        return openai_tool_choice({"type": "function", "function": {"name": raw["name"]}}, tools), tools
    if kind == "allowed_tools" and raw.get("mode") in ("auto", "required") and isinstance(raw.get("tools"), list):
        names = {t.get("name") for t in raw["tools"] if isinstance(t, dict) and t.get("type") == "function"}
        if len(names) != len(raw["tools"]) or not names <= {t.name for t in tools}:
            raise bad_request("tool_choice.tools must list function tools of `tools` by name, as "
                              '{"type": "function", "name": "..."}', param="tool_choice.tools")
        allowed = [t for t in tools if t.name in names]
        return openai_tool_choice(raw["mode"], allowed), allowed
    if kind in _HOSTED_TOOL_CHOICES:
        raise bad_request(f"tool_choice of type {kind!r} names a built-in tool, which this server does not run",
                          param="tool_choice", code="unsupported_tool")
    raise bad_request(f"invalid tool_choice {json.dumps(raw)[:200]}: use \"none\", \"auto\", \"required\", "
                      '{"type": "function", "name": "..."} or {"type": "allowed_tools", "mode": "auto", '
                      '"tools": [...]}', param="tool_choice")


def guided(body: ResponseCreateRequest, tools: list[ToolSpec], choice: ToolChoice) -> dict[str, Any]:
    """The constrained decoding of `text.format` (chat's response_format, flat), a forced call's schema, or
    vLLM's guided_* extras; one of them, as on chat completions."""
    fmt = body.text.format if body.text is not None else None
    if fmt is not None and fmt.type == "json_schema":
        if fmt.name is None:
            raise APIError(400, "missing required parameter: 'text.format.name'", param="text.format.name",
                           code="missing_required_parameter")
        if fmt.schema_ is None:
            raise APIError(400, "missing required parameter: 'text.format.schema'", param="text.format.schema",
                           code="missing_required_parameter")
    return guided_decoding(tools, choice, fmt.type if fmt is not None else "text",
                           fmt.schema_ if fmt is not None else None, vllm_guided(body), fmt_param="text.format")


def text_echo(text: TextConfig | None) -> dict[str, Any]:
    fmt = text.format if text is not None and text.format is not None else TextFormat()
    return {"format": fmt.model_dump(mode="json", by_alias=True, exclude_none=True), "verbosity": "medium"}

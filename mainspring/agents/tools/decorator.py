"""`@tool`: a typed Python function becomes a `Tool` whose JSON schema comes from its type hints and docstring.

    @tool(idempotent=True)
    def add(a: int, b: int = 1) -> int:
        '''Add two numbers.

        Args:
            a: the first number
            b: the second number
        '''
        return a + b

Arguments the model sends are validated (and coerced, e.g. "3" -> 3) by a pydantic model built from the
signature; bad ones come back as `ToolResult(is_error=True)` naming each field, so the model can correct itself.
A parameter annotated `ToolContext` receives the call's context and is not part of the schema.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
import typing
from dataclasses import dataclass
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model
from pydantic_core import to_jsonable_python

from mainspring.agents.tools.base import ToolContext, ToolError, ToolResult, TransientToolError

TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # what OpenAI-style function names allow
_SECTION = re.compile(r"^\s*(Args|Arguments|Parameters|Params|Returns?|Raises|Yields|Examples?|Notes?)\s*:\s*$")
_GOOGLE_ARG = re.compile(r"^\s*(\*{0,2}\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")
_REST_PARAM = re.compile(r"^\s*:param\s+(?:[^:]*\s)?(\w+)\s*:\s*(.*)$")


@dataclass
class FunctionTool:
    """A `Tool` backed by a Python function; made by `@tool`."""

    name: str
    description: str
    parameters: dict
    fn: Callable[..., Any]
    args_model: type[BaseModel]
    ctx_param: str | None = None
    idempotent: bool = False
    requires_approval: bool = False
    timeout_s: float = 60
    retries: int = 0

    async def call(self, args: dict, ctx: ToolContext) -> ToolResult:
        if args is None:
            args = {}
        if not isinstance(args, dict):
            return ToolResult(f"invalid arguments for tool {self.name!r}: expected a JSON object, "
                              f"got {type(args).__name__}", is_error=True)
        try:
            validated = self.args_model.model_validate(args)
        except ValidationError as exc:
            return ToolResult(describe_validation_error(self.name, exc), data={"errors": _error_list(exc)},
                              is_error=True)
        # Field values as validated (nested pydantic models stay models), not model_dump()'s dicts.
        kwargs = {name: getattr(validated, name) for name in type(validated).model_fields}
        if self.ctx_param:
            kwargs[self.ctx_param] = ctx
        try:
            if inspect.iscoroutinefunction(self.fn):
                value = await self.fn(**kwargs)
            else:
                # A worker thread keeps a blocking function from stalling the run loop. If the loop gives up on it
                # (timeout, cancel) the thread still runs to completion: Python cannot kill a thread.
                value = await asyncio.to_thread(self.fn, **kwargs)
        except TransientToolError:
            raise  # the loop retries these
        except ToolError as exc:
            return ToolResult(str(exc) or type(exc).__name__, is_error=True)
        return as_tool_result(value)


def tool(fn: Callable[..., Any] | None = None, *, name: str | None = None, description: str | None = None,
         idempotent: bool = False, requires_approval: bool = False, timeout_s: float = 60,
         retries: int = 0) -> Any:
    """Decorator (bare `@tool` or `@tool(...)`) turning a sync or async function into a `FunctionTool`."""

    def wrap(f: Callable[..., Any]) -> FunctionTool:
        return function_tool(f, name=name, description=description, idempotent=idempotent,
                             requires_approval=requires_approval, timeout_s=timeout_s, retries=retries)

    return wrap(fn) if fn is not None else wrap


def function_tool(fn: Callable[..., Any], *, name: str | None = None, description: str | None = None,
                  idempotent: bool = False, requires_approval: bool = False, timeout_s: float = 60,
                  retries: int = 0) -> FunctionTool:
    """What `@tool` does, as a plain function (for tools built at run time)."""
    tool_name = name or fn.__name__
    if not TOOL_NAME.match(tool_name):
        raise ValueError(f"tool name {tool_name!r} must be 1-64 letters, digits, '_' or '-'")
    if timeout_s <= 0 or retries < 0:
        raise ValueError(f"tool {tool_name!r}: timeout_s must be > 0 and retries >= 0")
    summary, arg_docs = parse_docstring(inspect.getdoc(fn) or "")
    args_model, ctx_param = _arguments_model(fn, tool_name, arg_docs)
    return FunctionTool(
        name=tool_name, description=description if description is not None else summary,
        parameters=clean_schema(args_model.model_json_schema()), fn=fn, args_model=args_model,
        ctx_param=ctx_param, idempotent=idempotent, requires_approval=requires_approval,
        timeout_s=float(timeout_s), retries=int(retries))


def _arguments_model(fn: Callable[..., Any], tool_name: str,
                     arg_docs: dict[str, str]) -> tuple[type[BaseModel], str | None]:
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception as exc:  # a string annotation naming something not importable where fn was defined
        raise TypeError(f"tool {tool_name!r}: cannot resolve the type hints of {fn.__qualname__}: {exc}") from exc
    fields: dict[str, Any] = {}
    ctx_param = None
    for param in inspect.signature(fn).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise TypeError(f"tool {tool_name!r}: *args/**kwargs cannot be described by a JSON schema")
        if param.kind is param.POSITIONAL_ONLY:
            raise TypeError(f"tool {tool_name!r}: positional-only parameter {param.name!r} cannot be passed by name")
        annotation = hints.get(param.name, Any)
        if annotation is ToolContext:
            ctx_param = param.name
            continue
        default = ... if param.default is param.empty else param.default
        fields[param.name] = (annotation, Field(default, description=arg_docs.get(param.name)))
    model = create_model(f"{tool_name}_arguments", __config__=ConfigDict(extra="forbid"), **fields)
    return model, ctx_param


def clean_schema(schema: Any) -> Any:
    """The JSON schema without pydantic's generated `title`s (noise in a prompt); property names stay."""
    if isinstance(schema, list):
        return [clean_schema(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key in ("properties", "$defs", "definitions", "patternProperties") and isinstance(value, dict):
            out[key] = {name: clean_schema(sub) for name, sub in value.items()}  # keys here are names, not keywords
        elif key == "title" and isinstance(value, str):
            continue
        else:
            out[key] = clean_schema(value)
    return out


def parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """(description, {param: description}) from a Google-style `Args:` section or reST `:param x:` lines."""
    summary: list[str] = []
    args: dict[str, str] = {}
    section: str | None = None
    current: str | None = None
    arg_indent = 0  # indent of the first argument line; deeper lines continue the current argument
    for line in doc.splitlines():
        rest = _REST_PARAM.match(line)
        if rest:
            current, section = rest.group(1), "rest"
            args[current] = rest.group(2).strip()
            continue
        header = _SECTION.match(line)
        if header:
            section, current = header.group(1).lower(), None
            continue
        if section is None:
            summary.append(line)
        elif section in ("args", "arguments", "parameters", "params"):
            arg = _GOOGLE_ARG.match(line)
            indent = len(line) - len(line.lstrip())
            if arg and (current is None or indent <= arg_indent):
                current = arg.group(1).lstrip("*")
                arg_indent = indent
                args[current] = arg.group(2).strip()
            elif current and line.strip():
                args[current] = f"{args[current]} {line.strip()}".strip()
        elif section == "rest" and current and line.strip() and not line.lstrip().startswith(":"):
            args[current] = f"{args[current]} {line.strip()}".strip()
    paragraphs = "\n".join(summary).strip().split("\n\n")
    description = "\n\n".join(" ".join(p.split()) for p in paragraphs if p.strip())
    return description, args


def describe_validation_error(tool_name: str, exc: ValidationError) -> str:
    """One line per bad field, e.g. "`k`: Input should be a valid integer (got 'x')"."""
    lines = [f"invalid arguments for tool {tool_name!r}:"]
    for err in exc.errors(include_url=False):
        where = ".".join(str(p) for p in err["loc"]) or "(arguments)"
        message = err["msg"]
        if err["type"] == "extra_forbidden":
            message = "unknown argument"
        elif err["type"] != "missing":
            message += f" (got {_short(err.get('input'))})"
        lines.append(f"- `{where}`: {message}")
    return "\n".join(lines)


def _error_list(exc: ValidationError) -> list[dict]:
    return [{"field": ".".join(str(p) for p in e["loc"]), "type": e["type"], "message": e["msg"]}
            for e in exc.errors(include_url=False)]


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "…"


def as_tool_result(value: Any) -> ToolResult:
    """A function's return value as what the model sees: strings as they are, anything else as JSON."""
    if isinstance(value, ToolResult):
        return value
    if value is None:
        return ToolResult("")
    if isinstance(value, str):
        return ToolResult(value)
    data = to_jsonable_python(value, fallback=str)
    return ToolResult(json.dumps(data, ensure_ascii=False), data=data)

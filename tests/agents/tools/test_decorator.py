import asyncio
import json
import threading
from typing import Literal, Optional

import pytest
from pydantic import BaseModel

from mainspring.agents.tools.base import Tool, ToolContext, ToolError, ToolResult, TransientToolError
from mainspring.agents.tools.decorator import FunctionTool, parse_docstring, tool

from .conftest import call


class Point(BaseModel):
    x: int
    y: int = 0


@tool(idempotent=True, timeout_s=5, retries=2)
def plot(label: str, points: list[Point], scale: float = 1.0, style: Literal["line", "bar"] = "line",
         limit: Optional[int] = None, ctx: ToolContext = None) -> dict:
    """Plot some points.

    Draws them on a chart.

    Args:
        label: the chart title
        points: the points to draw,
            in order
        style: how to draw them
    """
    return {"label": label, "xs": [p.x for p in points], "scale": scale, "style": style, "limit": limit,
            "run": ctx.run_id}


def test_schema_from_type_hints_and_docstring_is_exact():
    assert isinstance(plot, FunctionTool) and isinstance(plot, Tool)
    assert plot.name == "plot"
    assert plot.description == "Plot some points.\n\nDraws them on a chart."
    assert (plot.idempotent, plot.requires_approval, plot.timeout_s, plot.retries) == (True, False, 5.0, 2)
    assert plot.parameters == {
        "$defs": {"Point": {"type": "object", "properties": {"x": {"type": "integer"},
                                                             "y": {"type": "integer", "default": 0}},
                            "required": ["x"]}},
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "label": {"type": "string", "description": "the chart title"},
            "points": {"type": "array", "items": {"$ref": "#/$defs/Point"},
                       "description": "the points to draw, in order"},
            "scale": {"type": "number", "default": 1.0},
            "style": {"type": "string", "enum": ["line", "bar"], "default": "line", "description": "how to draw them"},
            "limit": {"anyOf": [{"type": "integer"}, {"type": "null"}], "default": None},
        },
        "required": ["label", "points"],
    }
    assert "ctx" not in json.dumps(plot.parameters)


def test_valid_arguments_are_coerced_and_the_context_is_passed(ctx):
    result = call(plot, {"label": "a", "points": [{"x": "3"}, {"x": 4, "y": 1}], "scale": "2.5"}, ctx)
    assert not result.is_error
    assert result.data == {"label": "a", "xs": [3, 4], "scale": 2.5, "style": "line", "limit": None, "run": "run-1"}
    assert json.loads(result.content) == result.data


@pytest.mark.parametrize("args, expected", [
    ({"points": []}, "- `label`: Field required"),
    ({"label": "a", "points": [{"y": 1}]}, "- `points.0.x`: Field required"),
    ({"label": "a", "points": [], "scale": "big"}, "- `scale`: Input should be a valid number, unable to parse "
                                                   "string as a number (got 'big')"),
    ({"label": "a", "points": [], "style": "pie"}, "- `style`: Input should be 'line' or 'bar' (got 'pie')"),
    ({"label": "a", "points": [], "colour": "red"}, "- `colour`: unknown argument"),
    ({"label": "a", "points": "nope"}, "- `points`: Input should be a valid list (got 'nope')"),
])
def test_bad_arguments_come_back_as_an_error_result_naming_the_field(ctx, args, expected):
    result = call(plot, args, ctx)
    assert result.is_error
    assert result.content.startswith("invalid arguments for tool 'plot':\n")
    assert expected in result.content.splitlines()


def test_arguments_that_are_not_an_object_are_an_error_result(ctx):
    result = call(plot, ["a"], ctx)  # type: ignore[arg-type]
    assert result.is_error and "expected a JSON object, got list" in result.content


def test_sync_functions_run_in_a_worker_thread_and_async_ones_on_the_loop(ctx):
    seen = {}

    @tool
    def blocking(n: int) -> int:
        seen["sync"] = threading.current_thread() is threading.main_thread()
        return n * 2

    @tool(name="later")
    async def waits(n: int) -> str:
        await asyncio.sleep(0)
        seen["async"] = threading.current_thread() is threading.main_thread()
        return f"got {n}"

    assert call(blocking, {"n": 21}, ctx).content == "42"
    assert call(waits, {"n": 1}, ctx) == ToolResult("got 1")
    assert seen == {"sync": False, "async": True}
    assert waits.name == "later" and blocking.parameters["required"] == ["n"]


def test_tool_errors_are_shown_to_the_model_but_transient_ones_reach_the_loop(ctx):
    @tool
    def fails(kind: str) -> str:
        if kind == "plain":
            raise ToolError("no such customer: 7")
        raise TransientToolError("database busy")

    assert call(fails, {"kind": "plain"}, ctx) == ToolResult("no such customer: 7", is_error=True)
    with pytest.raises(TransientToolError, match="database busy"):
        call(fails, {"kind": "busy"}, ctx)


def test_return_values_become_content():
    @tool
    def returns(kind: str):
        return {"none": None, "text": "plain", "result": ToolResult("as is", data=1), "list": [1, "a"]}[kind]

    ctx = ToolContext("r", "c", "k", workspace=None)  # type: ignore[arg-type]
    assert call(returns, {"kind": "none"}, ctx) == ToolResult("")
    assert call(returns, {"kind": "text"}, ctx) == ToolResult("plain")
    assert call(returns, {"kind": "result"}, ctx) == ToolResult("as is", data=1)
    assert call(returns, {"kind": "list"}, ctx) == ToolResult('[1, "a"]', data=[1, "a"])


def test_functions_that_cannot_be_described_are_refused_at_decoration():
    def loose(**options):
        return options

    with pytest.raises(TypeError, match=r"tool 'loose': \*args/\*\*kwargs"):
        tool(loose)
    with pytest.raises(ValueError, match="tool name '<lambda>'"):
        tool(lambda: None)  # a lambda needs an explicit name
    with pytest.raises(ValueError, match="tool name 'has space'"):
        tool(name="has space")(lambda: None)
    with pytest.raises(ValueError, match="timeout_s must be > 0"):
        tool(name="slow", timeout_s=0)(lambda: None)


def test_docstring_styles():
    google = "Summary line\ncontinued.\n\nArgs:\n    a (int): first\n    b: second\n        more\n\nReturns:\n    x"
    assert parse_docstring(google) == ("Summary line continued.", {"a": "first", "b": "second more"})
    rest = "Do it.\n\n:param a: the a\n:param int b: the b\n:returns: nothing"
    assert parse_docstring(rest) == ("Do it.", {"a": "the a", "b": "the b"})

"""`ToolRegistry`: the tools a run may call, by unique name; `builtin_registry` builds the standard set.

Packs above the agents layer (the scenarios) add their tools without this module importing them: a pack names a
factory `(settings) -> Iterable[Tool]` in the `mainspring.agent_tools` entry-point group (pyproject.toml), and
`builtin_registry` registers what each factory returns, packs in name order.
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any, Callable, Iterable, Iterator

from mainspring.agents.tools.base import Tool, openai_schema
from mainspring.agents.tools.decorator import TOOL_NAME, function_tool
from mainspring.config import Settings, get_settings

TOOL_PACKS = "mainspring.agent_tools"  # the entry-point group of tool packs


class UnknownToolError(KeyError):
    """`registry.get(name)` for a name that is not registered; the message lists the known names."""

    def __str__(self) -> str:  # KeyError's own str() would print the message as a quoted repr
        return str(self.args[0]) if self.args else "unknown tool"


class ToolRegistry:
    def __init__(self, tools: Iterable[Tool | Callable[..., Any]] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        for item in tools:
            self.register(item)

    def register(self, item: Tool | Callable[..., Any]) -> Tool:
        """Add a tool (or a plain function, wrapped with `@tool` defaults); a name may be registered once."""
        candidate: Any = item if isinstance(item, Tool) else function_tool(item) if callable(item) else None
        if candidate is None:
            raise TypeError(f"not a tool: {item!r} (needs name, description, parameters, idempotent, "
                            "requires_approval, timeout_s, retries and an async call(args, ctx))")
        if not TOOL_NAME.match(candidate.name):
            raise ValueError(f"tool name {candidate.name!r} must be 1-64 letters, digits, '_' or '-'")
        if candidate.name in self._tools:
            raise ValueError(f"a tool named {candidate.name!r} is already registered")
        self._tools[candidate.name] = candidate
        return candidate

    def get(self, name: str) -> Tool:
        try:
            return self._tools[name]
        except KeyError:
            known = ", ".join(sorted(self._tools)) or "(none)"
            raise UnknownToolError(f"unknown tool {name!r}; known tools: {known}") from None

    def remove(self, name: str) -> Tool:
        tool = self.get(name)
        del self._tools[name]
        return tool

    def names(self) -> list[str]:
        return list(self._tools)

    def schemas(self) -> list[dict]:
        """The OpenAI `tools` list, in registration order."""
        return [openai_schema(t) for t in self._tools.values()]

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[Tool]:
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)


def pack_tools(settings: Settings) -> list[Tool | Callable[..., Any]]:
    """The tools of every installed tool pack (the 3D scenario's scene_validate and scene_render, ...)."""
    tools: list[Tool | Callable[..., Any]] = []
    for pack in sorted(entry_points(group=TOOL_PACKS), key=lambda ep: ep.name):
        tools.extend(pack.load()(settings))
    return tools


def builtin_registry(settings: Settings | None = None, enable_http: bool = False) -> ToolRegistry:
    """python, shell, search, sql, files, then the tool packs' tools (the 3D scenario's scene_validate and
    scene_render); and http_fetch only when `enable_http` (off by default)."""
    # Imported here so that `import registry` stays light (search pulls in torch and bm25s lazily anyway).
    from mainspring.agents.tools.code import python_tool, shell_tool
    from mainspring.agents.tools.files import files_tool
    from mainspring.agents.tools.search import search_tool
    from mainspring.agents.tools.sql import sql_tool

    settings = settings or get_settings()
    registry = ToolRegistry([python_tool(settings), shell_tool(settings), search_tool(settings), sql_tool(settings),
                             files_tool(settings)])
    for pack_tool in pack_tools(settings):
        registry.register(pack_tool)
    if enable_http:
        from mainspring.agents.tools.http_fetch import http_fetch_tool

        registry.register(http_fetch_tool(settings))
    return registry

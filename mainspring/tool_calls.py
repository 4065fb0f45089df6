"""The JSON shape of a tool call a model writes, shared by the HTTP API and the ChatModel layer."""

from __future__ import annotations

import json
from typing import Any


def call_items(value: Any, names: set[str]) -> list[tuple[str, dict[str, Any]]]:
    """(name, arguments) for a decoded call object or list of them, all naming known tools; else [].

    Accepts {"name", "arguments"} and the {"name", "parameters"} spelling small models also use;
    arguments may be an object or a JSON string of one."""
    calls = []
    for item in value if isinstance(value, list) else [value]:
        if not isinstance(item, dict) or item.get("name") not in names:
            return []
        args = item.get("arguments", item.get("parameters", {}))
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except ValueError:
                return []
        if not isinstance(args, dict):
            return []
        calls.append((item["name"], args))
    return calls

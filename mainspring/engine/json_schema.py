"""Client JSON schemas made ready for constrained decoding: one function, `prepare_schema`.

Every schema that reaches the grammar compiler passes through it (grammar.grammar_key), and a
schema embedded in a larger one (a tool's parameters inside the forced-call wrapper) passes
through it with the pointer where it sits. What it does and why:

- Local references (`#`, `#/$defs/X`, `#/definitions/X`, any JSON pointer) are what Pydantic's
  `model_json_schema()` emits for nested models. They resolve against the document root, so a
  schema moved under `/properties/arguments` must have them rebased there, or they point at
  nothing. Recursive references are kept as references: the compiler handles recursion, and
  max_tokens bounds the output.
- A reference that leaves the document (`other.json#/X`, `https://...`) would need a fetch: a
  clear error instead. A local one that points at nothing is an error naming it.
- `format` is an annotation in JSON Schema unless a validator opts in. The compiler enforces the
  formats it knows and rejects the rest, so unknown ones (Anthropic's SDK adds `"format": "text"`
  to every string, Pydantic writes `binary`, `path`, `password`, ...) are dropped.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

from mainspring.engine.errors import InvalidRequestError

# what llguidance enforces; any other format is dropped as the annotation it is
KNOWN_FORMATS = frozenset({"date-time", "time", "date", "duration", "email", "hostname", "uri", "ipv4", "ipv6",
                           "uuid"})
# keywords whose values are data, not schemas: a "$ref" key inside them is not a reference
_DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples", "example", "x-guidance"})


def prepare_schema(schema: Any, at: str = "") -> Any:
    """`schema` with local $refs checked (and rebased to sit at JSON pointer `at` of the document it
    is embedded in; "" = it is the document) and unknown string formats dropped; never edits it."""
    if not isinstance(schema, dict):
        return schema  # true / false schemas, or a type error the compiler reports
    return _walk(schema, schema, at)


def _walk(node: Any, root: dict[str, Any], at: str) -> Any:
    if isinstance(node, list):
        return [_walk(x, root, at) for x in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "$ref" and isinstance(value, str):
            out[key] = _rebased(value, root, at)
        elif key == "format" and isinstance(value, str) and value not in KNOWN_FORMATS:
            continue
        elif key in _DATA_KEYWORDS:
            out[key] = value
        else:
            out[key] = _walk(value, root, at)
    return out


def _rebased(ref: str, root: dict[str, Any], at: str) -> str:
    if not ref.startswith("#"):
        raise InvalidRequestError(f"invalid JSON schema: the $ref {ref!r} points outside the schema; only local "
                                  "references are supported (\"#/$defs/Name\"): put the definitions under $defs")
    _resolve(ref, root)
    return "#" + at + ref[1:]


def _resolve(ref: str, root: dict[str, Any]) -> Any:
    """The node a local reference names (RFC 6901 pointer in a URI fragment), or a clear error."""
    node: Any = root
    pointer = unquote(ref[1:])
    if not pointer:
        return node
    for raw in pointer.lstrip("/").split("/"):
        part = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise InvalidRequestError(f"invalid JSON schema: the $ref {ref!r} points at nothing in the schema "
                                      "(define it under $defs at the schema's top level)")
    return node

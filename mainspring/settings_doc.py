"""The settings table of docs/configuration.md, rendered from `Settings` at run time so the two cannot drift.

    python -m mainspring.settings_doc            # print the table
    python -m mainspring.settings_doc --write    # rewrite it between the markers of docs/configuration.md

tests/test_docs.py fails when the table in the file differs from what this renders.
"""

from __future__ import annotations

import argparse
import enum
import json
import re
from pathlib import Path
from typing import Any

from annotated_types import Ge, Gt, Le, Lt
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from mainspring.config import Settings

START = "<!-- settings:start -->"
END = "<!-- settings:end -->"
CONFIGURATION_DOC = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"
REGENERATE = "python -m mainspring.settings_doc --write"

# Defaults computed from the machine (home, temporary directory) would make the table differ from one
# checkout to the next; they are written as what they mean instead.
_COMPUTED_DEFAULTS = {
    "data_dir": "`$XDG_DATA_HOME/mainspring`, else `~/.local/share/mainspring`",
    "sandbox_dir": "`<temp dir>/mainspring-sandbox` (`/tmp/mainspring-sandbox`)",
}
_BOUNDS = ((Ge, "ge", "≥"), (Gt, "gt", ">"), (Le, "le", "≤"), (Lt, "lt", "<"))


def env_var(name: str, field: FieldInfo) -> str:
    """The environment variable that sets this field: the prefix + its name, or its own alias."""
    alias = field.validation_alias if isinstance(field.validation_alias, str) else field.alias
    if alias:
        return alias.upper()
    return f"{Settings.model_config.get('env_prefix', '')}{name}".upper()


def type_text(field: FieldInfo) -> str:
    """The field's type and bounds, e.g. `int ≥ 1, ≤ 65535`."""
    annotation = field.annotation
    name = annotation.__name__ if isinstance(annotation, type) and not getattr(annotation, "__args__", None) \
        else str(annotation)
    # module paths dropped, Python 3.13's pathlib._local included: the table reads the same on every version
    name = re.sub(r"\b(?:typing|pathlib(?:\._local)?)\.", "", name)
    bounds = [f"{sign} {getattr(m, attr)}" for m in field.metadata for kind, attr, sign in _BOUNDS
              if isinstance(m, kind)]
    return ", ".join([name, *bounds])


def default_text(name: str, field: FieldInfo) -> str:
    """The default as a user would write it in the environment (`true`, `8321`, empty)."""
    if name in _COMPUTED_DEFAULTS:
        return _COMPUTED_DEFAULTS[name]
    if field.default is PydanticUndefined and field.default_factory is not None:
        value: Any = field.default_factory()  # type: ignore[call-arg]  # Settings' factories take no arguments
    else:
        value = field.default
    if value is None:
        return "none"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    if isinstance(value, (list, tuple, dict)):
        return f"`{json.dumps(value, default=str)}`"
    text = str(value)
    if isinstance(value, Path):
        text = text.replace(str(Path.home()), "~", 1)
    return f"`{text}`" if text else "empty"


def _cell(text: str) -> str:
    # <data_dir> outside backticks would be read as an HTML tag and vanish; inside them it shows as written
    parts = text.replace("|", "\\|").replace("\n", " ").split("`")
    return "`".join(p if i % 2 else p.replace("<", "&lt;") for i, p in enumerate(parts))


def settings_markdown() -> str:
    """Every `Settings` field as one row: variable, type, default, meaning (the field's description)."""
    rows = ["| variable | type | default | meaning |", "|---|---|---|---|"]
    for name, field in Settings.model_fields.items():
        cells = (f"`{env_var(name, field)}`", _cell(type_text(field)), default_text(name, field),
                 _cell(field.description or ""))
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def table_in(text: str) -> str | None:
    """The table between the settings markers of a document, or None when it has no markers."""
    if START not in text or END not in text:
        return None
    return text.split(START, 1)[1].split(END, 1)[0].strip("\n")


def write_table(path: Path = CONFIGURATION_DOC) -> bool:
    """Rewrite the table between the markers of `path`; True when it changed."""
    text = path.read_text(encoding="utf-8")
    if table_in(text) is None:
        raise SystemExit(f"{path} has no {START} ... {END} block")
    head, _, rest = text.partition(START)
    _, _, tail = rest.partition(END)
    updated = f"{head}{START}\n{settings_markdown()}\n{END}{tail}"
    path.write_text(updated, encoding="utf-8")
    return updated != text


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m mainspring.settings_doc", description=__doc__.splitlines()[0])
    parser.add_argument("--write", nargs="?", const=CONFIGURATION_DOC, type=Path, metavar="FILE",
                        help=f"rewrite the table between the settings markers (default {CONFIGURATION_DOC.name})")
    args = parser.parse_args(argv)
    if args.write is None:
        print(settings_markdown())
    else:
        print(f"{args.write}: {'updated' if write_table(args.write) else 'already up to date'}")


if __name__ == "__main__":
    main()

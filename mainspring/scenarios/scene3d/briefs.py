"""The scene briefs in briefs/*.json: what to build in plain language, the ids the scene must
use, the constraints that decide whether it was built, and a reference scene that passes them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from mainspring.scenes.constraint_model import Constraint, Id

BRIEFS_DIR = Path(__file__).resolve().parent / "briefs"


class Brief(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    id: Id
    brief: Annotated[str, StringConstraints(min_length=10, max_length=200)]
    objects: Annotated[list[Id], Field(min_length=1, max_length=6)]  # ids the scene must contain
    constraints: Annotated[list[Constraint], Field(min_length=1, max_length=12)]
    reference: dict[str, Any]  # a scene/0.1 document that passes `constraints`

    def request(self) -> str:
        """The brief as a user would ask for it, naming the ids the checks refer to."""
        return f"{self.brief} Use the ids: {', '.join(self.objects)}."


def load_brief(path: Path) -> Brief:
    try:
        return Brief.model_validate(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, ValidationError) as exc:
        raise ValueError(f"bad brief {path.name}: {exc}") from None


def load_briefs(directory: Path = BRIEFS_DIR) -> list[Brief]:
    """Every brief, in file-name order."""
    return [load_brief(p) for p in sorted(directory.glob("*.json"))]

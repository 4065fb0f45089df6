"""What goes wrong with a scene: a Violation names the JSON path at fault and the reason."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Violation:
    path: str  # JSONPath of the value at fault: "$.objects[3].size[1]"
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"

    def to_dict(self) -> dict[str, str]:
        return {"path": self.path, "message": self.message}


class SceneError(Exception):
    """A scene that cannot be used: unreadable, invalid, or referring to a missing asset."""


class SceneInvalid(SceneError):
    def __init__(self, violations: list[Violation]) -> None:
        self.violations = violations
        shown = "\n".join(f"  {v}" for v in violations[:20])
        more = f"\n  ... and {len(violations) - 20} more" if len(violations) > 20 else ""
        super().__init__(f"invalid scene ({len(violations)} problem{'s' * (len(violations) != 1)}):\n{shown}{more}")

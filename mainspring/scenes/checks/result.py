"""The outcome of one constraint: pass/fail, the quantity measured, and a sentence for people."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ConstraintResult:
    index: int  # position in the list checked
    type: str
    label: str  # "on_top_of(book, table_top)"
    passed: bool
    quantity: str  # what was measured: "gap", "overlap_volume", "pixels", "angle" ...
    value: float | None  # None when it could not be measured (detail says why)
    unit: str  # "m", "m^3", "m^2", "px", "deg"
    detail: str

    def __str__(self) -> str:
        mark = "PASS" if self.passed else "FAIL"
        shown = "n/a" if self.value is None else f"{self.value:.4g} {self.unit}"
        return f"{mark} {self.label}: {self.quantity} = {shown} ({self.detail})"

    def to_dict(self) -> dict:
        return {"index": self.index, "type": self.type, "label": self.label, "passed": self.passed,
                "quantity": self.quantity, "value": self.value, "unit": self.unit, "detail": self.detail}


def result(index: int, c, passed: bool, quantity: str, value: float | None, unit: str, detail: str) -> ConstraintResult:
    return ConstraintResult(index, c.type, label(c), bool(passed), quantity,
                            None if value is None else round(float(value), 9), unit, detail)


def label(c) -> str:
    args = [getattr(c, name) for name in ("a", "b") if getattr(c, name, None) is not None]
    ids = getattr(c, "ids", None)
    if ids is not None:
        args.append("*" if ids == "*" else ", ".join(ids))
    return f"{c.type}({', '.join(args)})"

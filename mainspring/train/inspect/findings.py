"""What an inspection check reports, and the options every check reads.

A check is a function `(domain, options) -> list[Finding]` (model-free), or `(domain, options,
source) -> list[Finding]` when it needs the current model's samples (`CompletionSource`). Checks
never modify the domain; a scorer that raises or hangs is a finding (see `score_safely`), never a
crash. Every finding names the items it is about, so a report line leads back to the data.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, Sequence

from mainspring.train.domains.base import Domain, Sample

Severity = Literal["info", "warning", "error"]
SEVERITIES: tuple[Severity, ...] = ("info", "warning", "error")


@dataclass(frozen=True)
class Finding:
    check: str  # dotted: "verifier.reference", "data.near_duplicates", "difficulty.no_signal"
    severity: Severity
    domain: str
    message: str  # one line a person reads in the summary table
    item_ids: tuple[str, ...] = ()  # the samples it is about (empty: the domain as a whole)
    evidence: dict[str, Any] = field(default_factory=dict)  # JSON-able numbers and short strings
    fix: str = ""  # what to do about it

    def to_json(self) -> dict[str, Any]:
        return {"check": self.check, "severity": self.severity, "domain": self.domain, "message": self.message,
                "item_ids": list(self.item_ids), "evidence": self.evidence, "fix": self.fix}


@dataclass(frozen=True)
class InspectOptions:
    samples: int = 8  # G: completions per item for difficulty calibration and label noise
    max_items: int | None = None  # per split; None = all
    seed: int = 0
    score_timeout_s: float = 10.0  # a scorer slower than this on one completion is flagged
    check_timeout_s: float | None = None  # a whole check slower than this is an error finding; None = no limit
    near_duplicate_jaccard: float = 0.8  # MinHash-estimated Jaccard of word 5-gram shingles
    leak_jaccard: float = 0.6  # train/eval pairs at or above this are a leak
    leak_cosine: float = 0.95  # embedding similarity (when the embedding model is installed)
    use_embeddings: bool = True


def items(domain: Domain, options: InspectOptions, split: str = "train") -> list[Sample]:
    """The samples of `split` ("train" | "eval") a check looks at, capped by `max_items`."""
    samples = domain.train if split == "train" else domain.eval
    return samples if options.max_items is None else samples[:options.max_items]


class CompletionSource(Protocol):
    """The current model's completions: `n` per sample, at the domain's temperature and max tokens."""

    def complete(self, domain: Domain, samples: Sequence[Sample], n: int) -> list[list[str]]: ...

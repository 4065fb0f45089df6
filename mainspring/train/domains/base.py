"""What a training domain is: a data set with a held-out split, a scorer, and its own settings.

The contract every domain keeps (the trainer, the evaluator and the fine-tuning jobs API rely on it):

- `Sample` is one prompt: `messages` (chat, rendered with the model's template) plus `reference`,
  whatever the scorer needs (an answer, unit tests, a schema, a brief). Ids are unique per domain.
- `Scorer.score(sample, completion) -> Score`: `total` in [0, 1] and named sub-scores in [0, 1].
  It may raise, hang or return NaN: `score_safely` turns each of those into a zero score with the
  reason in `error`, so one bad sample never stops a run (the trainer counts and reports them).
- `DomainSettings` are the per-domain knobs of the hierarchical reward and interference control.
- `reference_completion` (optional): the completion a perfect model would write for a sample;
  inspection checks it scores full marks and builds its wrong-answer probes from it.
"""

from __future__ import annotations

import math
import concurrent.futures as cf
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, runtime_checkable


class DomainError(ValueError):
    """A domain that cannot be used: unknown name, bad data file, empty or duplicated data set."""


@dataclass(frozen=True)
class Sample:
    id: str
    domain: str
    messages: tuple[dict[str, str], ...]  # [{"role": "system"|"user"|"assistant", "content": ...}]
    reference: dict[str, Any] = field(default_factory=dict)

    @property
    def prompt_text(self) -> str:
        """The user's words (the router and the inspector read this, not the template)."""
        return "\n".join(m["content"] for m in self.messages if m["role"] == "user")


@dataclass
class Score:
    total: float
    parts: dict[str, float] = field(default_factory=dict)
    error: str | None = None  # set when the scorer failed (raised, timed out, returned NaN)


@runtime_checkable
class Scorer(Protocol):
    def score(self, sample: Sample, completion: str) -> Score: ...


@dataclass
class DomainSettings:
    max_tokens: int = 64
    temperature: float = 1.0
    loss_weight: float = 1.0  # multiplies the domain's share of the loss
    lr_scale: float = 1.0  # multiplies the learning rate of the domain's gradient (interference control)
    sampling_weight: float = 1.0  # relative share of prompts per step
    score_timeout_s: float = 30.0


@dataclass
class Domain:
    name: str
    train: list[Sample]
    eval: list[Sample]
    scorer: Scorer
    settings: DomainSettings = field(default_factory=DomainSettings)
    description: str = ""
    # the completion a perfect model would write for a sample; inspection checks it scores full marks
    # (None: the domain has no references, so its verifier's soundness cannot be checked)
    reference_completion: Callable[[Sample], str] | None = None

    def __post_init__(self) -> None:
        for split, samples in (("train", self.train), ("eval", self.eval)):
            if not samples:
                raise DomainError(f"domain {self.name!r}: the {split} split is empty")
            ids = [s.id for s in samples]
            if len(set(ids)) != len(ids):
                dup = next(i for i in ids if ids.count(i) > 1)
                raise DomainError(f"domain {self.name!r}: duplicate sample id {dup!r} in the {split} split")
        leak = {s.id for s in self.train} & {s.id for s in self.eval}
        if leak:
            raise DomainError(f"domain {self.name!r}: ids in both train and eval: {sorted(leak)[:3]}")


_pool = cf.ThreadPoolExecutor(max_workers=4, thread_name_prefix="scorer")


def score_safely(scorer: Scorer, sample: Sample, completion: str, timeout_s: float = 30.0) -> Score:
    """Score one completion; a failure of the scorer is a zero with its reason, never an exception."""
    fut = _pool.submit(scorer.score, sample, completion)
    try:
        s = fut.result(timeout=timeout_s)
    except cf.TimeoutError:
        return Score(0.0, error=f"scorer timed out after {timeout_s:g} s")
    except Exception as exc:  # a user's scorer may raise anything: it is counted, not fatal
        return Score(0.0, error=f"scorer raised {type(exc).__name__}: {exc}")
    if not isinstance(s, Score):
        return Score(0.0, error=f"scorer returned {type(s).__name__}, not Score")
    if not isinstance(s.total, (int, float)) or not math.isfinite(s.total):
        return Score(0.0, error=f"scorer returned a non-finite total {s.total!r}")
    parts = {k: float(v) for k, v in s.parts.items() if isinstance(v, (int, float)) and math.isfinite(v)}
    return Score(min(1.0, max(0.0, float(s.total))), parts, s.error)

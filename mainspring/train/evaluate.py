"""Held-out evaluation per domain (greedy), paired bootstrap confidence intervals of the change,
and the no-regression gate that decides whether a trained model may be exported.

The same eval prompts are scored before and after training, so the change is measured per prompt
(paired): the bootstrap resamples prompts, not the two runs independently, which gives far tighter
intervals for the same n.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from mainspring.train.domains.base import Domain, Sample
from mainspring.train.rollout import RolloutStats, generate_groups

BOOTSTRAP = 2000


@dataclass
class DomainEval:
    domain: str
    scores: dict[str, float]  # sample id -> total
    mean: float
    ci: tuple[float, float]  # 95% bootstrap CI of the mean
    mean_length: float  # completion tokens

    def to_dict(self) -> dict:
        return {"mean": self.mean, "ci": list(self.ci), "n": len(self.scores), "mean_length": self.mean_length,
                "scores": self.scores}


@dataclass
class Change:
    domain: str
    before: float
    after: float
    delta: float
    ci: tuple[float, float]  # paired bootstrap 95% CI of the delta
    n: int

    @property
    def significant(self) -> bool:
        """The interval excludes zero."""
        return self.ci[0] > 0 or self.ci[1] < 0

    def to_dict(self) -> dict:
        return {"before": self.before, "after": self.after, "delta": self.delta, "ci": list(self.ci), "n": self.n,
                "significant": self.significant}


@dataclass
class GateResult:
    passed: bool
    delta: float
    regressions: list[str] = field(default_factory=list)  # domains that dropped by more than delta


def eval_samples(domain: Domain, limit: int | None) -> list[Sample]:
    return domain.eval[:limit] if limit else list(domain.eval)


def evaluate(engine, domains: dict[str, Domain],
             limit: int | None = None) -> tuple[dict[str, DomainEval], RolloutStats]:
    """Greedy completions of every domain's held-out prompts, scored by the domain."""
    samples = [s for d in domains.values() for s in eval_samples(d, limit)]
    groups, stats = generate_groups(engine, samples, domains, 1, seed=0, step=0, greedy=True)
    out = {}
    for name in domains:
        mine = [g for g in groups if g.domain == name]
        scores = {g.sample.id: g.completions[0].reward for g in mine}
        vals = torch.tensor(list(scores.values()), dtype=torch.float64)
        lengths = [len(g.completions[0].completion_ids) for g in mine]
        out[name] = DomainEval(name, scores, float(vals.mean()), bootstrap_ci(vals),
                               sum(lengths) / max(1, len(lengths)))
    return out, stats


def bootstrap_ci(values: torch.Tensor, n: int = BOOTSTRAP, seed: int = 0, level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap CI of the mean of `values` (1-D)."""
    if values.numel() == 0:
        return (float("nan"), float("nan"))
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, values.numel(), (n, values.numel()), generator=g)
    means = values[idx].mean(dim=1)
    lo, hi = (1 - level) / 2, 1 - (1 - level) / 2
    return float(torch.quantile(means, lo)), float(torch.quantile(means, hi))


def compare(before: dict[str, DomainEval], after: dict[str, DomainEval], seed: int = 0) -> dict[str, Change]:
    """Per-domain change on the prompts both evaluations scored, with a paired bootstrap CI."""
    out = {}
    for name, b in before.items():
        a = after[name]
        ids = [i for i in b.scores if i in a.scores]
        x = torch.tensor([b.scores[i] for i in ids], dtype=torch.float64)
        y = torch.tensor([a.scores[i] for i in ids], dtype=torch.float64)
        d = y - x
        out[name] = Change(name, float(x.mean()), float(y.mean()), float(d.mean()), bootstrap_ci(d, seed=seed),
                           len(ids))
    return out


def gate(changes: dict[str, Change], delta: float) -> GateResult:
    """Refuse when any domain's mean held-out score dropped by more than `delta`."""
    bad = [n for n, c in changes.items() if c.delta < -delta]
    return GateResult(not bad, delta, bad)

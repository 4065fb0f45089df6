"""Rollouts on Mainspring's own engine: G samples per prompt in one continuously batched call, then
each completion scored by its domain (the hierarchical reward: the sample's domain tag picks the
scorer; `router.py` supplies the tag for untagged prompts).

The G samples of a prompt are G requests with the same prompt ids: the engine computes the prompt's
KV once and the others hit it in the prefix cache. Each request has its own seed derived from
(run seed, step, prompt, sample), so a resumed run regenerates exactly what the uninterrupted run
would have.
"""

from __future__ import annotations

import concurrent.futures as cf
import time
from dataclasses import dataclass, field

import torch

from mainspring.engine.params import SamplingParams
from mainspring.train.domains.base import Domain, Sample, Score, score_safely


@dataclass
class Completion:
    prompt_ids: list[int]
    completion_ids: list[int]  # includes the EOS token when the model stopped by itself
    text: str
    finish_reason: str | None
    score: Score = field(default_factory=lambda: Score(0.0))

    @property
    def reward(self) -> float:
        return self.score.total


@dataclass
class Group:
    sample: Sample
    completions: list[Completion]

    @property
    def domain(self) -> str:
        return self.sample.domain

    def rewards(self) -> torch.Tensor:
        return torch.tensor([c.reward for c in self.completions], dtype=torch.float64)


@dataclass
class RolloutStats:
    seconds: float = 0.0
    completion_tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    score_seconds: float = 0.0
    scorer_errors: int = 0
    errors: list[str] = field(default_factory=list)  # first few messages, for the report

    @property
    def tokens_per_s(self) -> float:
        return self.completion_tokens / self.seconds if self.seconds else 0.0

    def add(self, other: "RolloutStats") -> None:
        for name in ("seconds", "completion_tokens", "prompt_tokens", "cached_tokens", "score_seconds",
                     "scorer_errors"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.errors = (self.errors + other.errors)[:5]


def request_seed(run_seed: int, step: int, prompt: int, sample: int) -> int:
    return (run_seed * 1_000_003 + step) * 10_007 + prompt * 101 + sample


def prompt_ids(engine, sample: Sample) -> list[int]:
    return engine.tokenizer.encode_chat(list(sample.messages), add_generation_prompt=True)


def generate_groups(engine, samples: list[Sample], domains: dict[str, Domain], group_size: int, *,
                    seed: int, step: int, first_prompt: int = 0,
                    greedy: bool = False) -> tuple[list[Group], RolloutStats]:
    """Generate `group_size` completions per sample (1 when greedy) and score them."""
    stats = RolloutStats()
    n = 1 if greedy else group_size
    prompts, params = [], []
    for i, s in enumerate(samples):
        d = domains[s.domain].settings
        ids = prompt_ids(engine, s)
        for j in range(n):
            prompts.append(ids)
            params.append(SamplingParams(
                temperature=0.0 if greedy else d.temperature, max_tokens=d.max_tokens,
                seed=None if greedy else request_seed(seed, step, first_prompt + i, j)))
    t0 = time.perf_counter()
    outs = engine.generate(prompts, params) if prompts else []
    stats.seconds = time.perf_counter() - t0
    groups = []
    for i, s in enumerate(samples):
        comps = []
        for out in outs[i * n:(i + 1) * n]:
            comps.append(Completion(list(out.prompt_token_ids), list(out.token_ids), out.text, out.finish_reason))
            stats.completion_tokens += len(out.token_ids)
            if out.usage is not None:
                stats.prompt_tokens += out.usage.prompt_tokens
                stats.cached_tokens += out.usage.cached_tokens
        groups.append(Group(s, comps))
    score_groups(groups, domains, stats)
    return groups, stats


_pool = cf.ThreadPoolExecutor(max_workers=4, thread_name_prefix="reward")


def score_groups(groups: list[Group], domains: dict[str, Domain], stats: RolloutStats) -> None:
    """Score every completion with its domain's scorer, a few at a time (code scorers wait on the
    sandbox); a failing scorer scores 0 and is counted."""
    t0 = time.perf_counter()
    jobs = []
    for g in groups:
        d = domains[g.domain]
        for c in g.completions:
            jobs.append((c, _pool.submit(score_safely, d.scorer, g.sample, c.text, d.settings.score_timeout_s)))
    for c, fut in jobs:
        c.score = fut.result()
        if c.score.error is not None:
            stats.scorer_errors += 1
            if len(stats.errors) < 5:
                stats.errors.append(c.score.error)
    stats.score_seconds = time.perf_counter() - t0

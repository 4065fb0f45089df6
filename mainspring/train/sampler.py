"""Which prompts a step trains on: domains drawn by weight, prompts in a shuffled order per domain.

`static` keeps each domain's sampling_weight. `progress` scales it by the domain's learning progress,
|mean reward of the last few steps - mean of the few before|, so domains that are moving get more
prompts and solved (or hopeless) ones fewer, with a floor so none starves. The whole state (orders,
cursors, reward history, RNG) is in `state_dict()`, saved in every checkpoint: a resumed run draws
exactly the prompts the uninterrupted one would have.
"""

from __future__ import annotations

import copy
import random

from mainspring.train.domains.base import Domain, Sample

WINDOW = 4  # steps per half of the learning-progress estimate
FLOOR = 0.1  # share of its static weight a domain keeps under `progress`


class DomainSampler:
    def __init__(self, domains: dict[str, Domain], mode: str = "static", seed: int = 0) -> None:
        if mode not in ("static", "progress"):
            raise ValueError(f"unknown sampling {mode!r} (static, progress)")
        self.domains = domains
        self.mode = mode
        self.rng = random.Random(seed)
        self.order: dict[str, list[int]] = {}
        self.cursor: dict[str, int] = {n: 0 for n in domains}
        self.epoch: dict[str, int] = {n: 0 for n in domains}
        self.history: dict[str, list[float]] = {n: [] for n in domains}
        for name, d in domains.items():
            self.order[name] = self._shuffled(len(d.train))
        if not any(d.settings.sampling_weight > 0 for d in domains.values()):
            raise ValueError("every domain has sampling_weight 0: nothing to train on")

    def _shuffled(self, n: int) -> list[int]:
        idx = list(range(n))
        self.rng.shuffle(idx)
        return idx

    def weights(self) -> dict[str, float]:
        base = {n: d.settings.sampling_weight for n, d in self.domains.items()}
        if self.mode == "progress":
            lp = {n: self._progress(n) for n in base}
            top = max(lp.values()) or 1.0
            base = {n: w * (FLOOR + (1 - FLOOR) * lp[n] / top) for n, w in base.items()}
        total = sum(base.values())
        return {n: w / total for n, w in base.items()}

    def _progress(self, name: str) -> float:
        h = self.history[name]
        if len(h) < 2 * WINDOW:
            return 1.0  # unknown yet: as if moving
        recent, before = h[-WINDOW:], h[-2 * WINDOW:-WINDOW]
        return abs(sum(recent) / WINDOW - sum(before) / WINDOW)

    def draw(self, n: int, cover: bool = False) -> list[Sample]:
        """n prompts, domains drawn by weight. `cover`: first one prompt of each domain with a weight
        (the heaviest first, up to n), then the rest by weight, so gradient surgery (PCGrad, CAGrad)
        sees every domain's gradient in every step: a domain absent from a step cannot be protected
        from the others' updates, and under a skewed mix it would be absent from most steps."""
        w = self.weights()
        names = [k for k in w if w[k] > 0]
        first = sorted(names, key=lambda k: -w[k])[:n] if cover else []
        picks = first + self.rng.choices(names, weights=[w[k] for k in names], k=n - len(first))
        return [self._next(name) for name in picks]

    def _next(self, name: str) -> Sample:
        train = self.domains[name].train
        if self.cursor[name] >= len(self.order[name]):
            self.order[name] = self._shuffled(len(train))
            self.cursor[name] = 0
            self.epoch[name] += 1
        i = self.order[name][self.cursor[name]]
        self.cursor[name] += 1
        return train[i]

    def observe(self, rewards: dict[str, float]) -> None:
        """Mean training reward per domain of a finished step."""
        for name, r in rewards.items():
            if name in self.history:
                self.history[name] = (self.history[name] + [float(r)])[-2 * WINDOW:]

    def state_dict(self) -> dict:
        return copy.deepcopy({"mode": self.mode, "rng": self.rng.getstate(), "order": self.order,
                              "cursor": self.cursor, "epoch": self.epoch, "history": self.history})

    def load_state_dict(self, state: dict) -> None:
        if set(state["order"]) != set(self.domains):
            raise ValueError(f"checkpoint sampler has domains {sorted(state['order'])}, "
                             f"this run has {sorted(self.domains)}")
        for name, order in state["order"].items():
            if len(order) != len(self.domains[name].train):
                raise ValueError(f"checkpoint sampler: domain {name!r} had {len(order)} training prompts, "
                                 f"now {len(self.domains[name].train)}")
        state = copy.deepcopy(state)  # a snapshot, never shared with the caller
        rng = state["rng"]
        self.rng.setstate((rng[0], tuple(rng[1]), rng[2]))
        self.order, self.cursor = state["order"], state["cursor"]
        self.epoch, self.history = state["epoch"], state["history"]

"""The domain sampler (weights, learning progress, exact state round trip) and the evaluation maths
(bootstrap CIs, paired change, the no-regression gate)."""

from collections import Counter

import pytest
import torch

from mainspring.train.domains.base import Domain, DomainSettings, Sample, Score
from mainspring.train.evaluate import Change, DomainEval, bootstrap_ci, compare, gate
from mainspring.train.sampler import WINDOW, DomainSampler


class Zero:
    def score(self, sample, completion):
        return Score(0.0)


def dom(name, n=10, weight=1.0):
    samples = [Sample(f"{name}{i}", name, ({"role": "user", "content": f"{name} {i}"},)) for i in range(n + 2)]
    return Domain(name, samples[:n], samples[n:], Zero(), DomainSettings(sampling_weight=weight))


def test_static_weights_set_the_share_of_prompts():
    s = DomainSampler({"a": dom("a", weight=3.0), "b": dom("b", weight=1.0)}, seed=0)
    counts = Counter(x.domain for x in s.draw(2000))
    assert 0.70 < counts["a"] / 2000 < 0.80
    # every prompt of a domain comes once per epoch, in a shuffled order
    t = DomainSampler({"a": dom("a", n=5)}, seed=1)
    first = [x.id for x in t.draw(5)]
    assert sorted(first) == [f"a{i}" for i in range(5)] and first != sorted(first)


def test_cover_puts_every_weighted_domain_in_each_draw():
    doms = {"big": dom("big", weight=20.0), "small": dom("small", weight=1.0), "off": dom("off", weight=0.0)}
    plain, covered = DomainSampler(doms, seed=0), DomainSampler(doms, seed=0)
    # by weight alone the small domain misses most 4-prompt steps; covered, it is in every one
    assert sum("small" in {x.domain for x in plain.draw(4)} for _ in range(50)) < 25
    for _ in range(50):
        got = Counter(x.domain for x in covered.draw(4, cover=True))
        assert got["small"] >= 1 and got["big"] >= 1 and "off" not in got
    # fewer prompts than domains: the heaviest come first
    assert [x.domain for x in DomainSampler(doms, seed=0).draw(1, cover=True)] == ["big"]


def test_progress_sampling_favours_the_domain_that_is_moving():
    s = DomainSampler({"moving": dom("moving"), "flat": dom("flat")}, mode="progress", seed=0)
    assert s.weights() == {"moving": 0.5, "flat": 0.5}  # no history yet
    for i in range(2 * WINDOW):
        s.observe({"moving": i / 10, "flat": 0.5})
    w = s.weights()
    assert w["moving"] > 0.85 and w["flat"] > 0.0  # the floor keeps a solved domain alive


def test_sampler_state_round_trips_exactly():
    a = DomainSampler({"a": dom("a"), "b": dom("b")}, mode="progress", seed=3)
    a.draw(7)
    a.observe({"a": 0.2, "b": 0.9})
    state = a.state_dict()
    b = DomainSampler({"a": dom("a"), "b": dom("b")}, mode="progress", seed=99)
    b.load_state_dict(state)
    assert [x.id for x in a.draw(30)] == [x.id for x in b.draw(30)]
    with pytest.raises(ValueError, match="domains"):
        DomainSampler({"a": dom("a")}).load_state_dict(state)


def test_bootstrap_ci_covers_the_mean_and_narrows_with_n():
    small = torch.tensor([0.0, 1.0] * 10, dtype=torch.float64)
    big = torch.tensor([0.0, 1.0] * 200, dtype=torch.float64)
    lo, hi = bootstrap_ci(small)
    assert lo < 0.5 < hi
    blo, bhi = bootstrap_ci(big)
    assert bhi - blo < (hi - lo) / 3


def test_paired_change_and_gate():
    ids = [f"s{i}" for i in range(40)]
    before = {"up": DomainEval("up", {i: 0.0 for i in ids}, 0.0, (0, 0), 1),
              "down": DomainEval("down", {i: 1.0 for i in ids}, 1.0, (1, 1), 1),
              "same": DomainEval("same", {i: float(k % 2) for k, i in enumerate(ids)}, 0.5, (0, 1), 1)}
    after = {"up": DomainEval("up", {i: float(k < 20) for k, i in enumerate(ids)}, 0.5, (0, 1), 1),
             "down": DomainEval("down", {i: float(k >= 4) for k, i in enumerate(ids)}, 0.9, (0, 1), 1),
             "same": DomainEval("same", {i: float(k % 2) for k, i in enumerate(ids)}, 0.5, (0, 1), 1)}
    ch = compare(before, after)
    assert ch["up"].delta == pytest.approx(0.5) and ch["up"].significant
    assert ch["down"].delta == pytest.approx(-0.1) and ch["down"].significant
    assert ch["same"].delta == 0 and not ch["same"].significant
    assert gate(ch, 0.05).regressions == ["down"] and not gate(ch, 0.05).passed
    assert gate(ch, 0.2).passed
    assert isinstance(ch["up"], Change)

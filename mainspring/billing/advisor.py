"""The simulator's advisor: concrete changes to a workload, each priced by re-simulating it.

Every proposal is applied to a COPY of the trace (or, for retention, to a copy of the policy) and
replayed under the same policies and price tables, so its dollar delta is measured on identical
tokens, not argued. Rules (design note §5 "Advisor rules"):

1. reorder: a volatile segment (history / user / assistant) before a stable one (tools / system /
   documents) breaks every shared prefix after it → order tools → system → documents → the rest;
2. merge: a shared stable prefix shorter than the policy's minimum is never cached → merge stable
   material into it until it reaches the minimum (cookbook: 900 → 1,100 tokens turns 0% into hits);
3. retention: a prefix reused after its TTL is paid again → extended retention (24 h automatic;
   1 h breakpoints at 2× writes, which pay off after 2 reads, 1.25× writes after 1);
4. batch: requests that can wait 24 h → the batch tier (0.5×);
5. output: when output is over half the cost, caching cannot do much; said, not simulated.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Callable, Sequence

from mainspring.billing.cache_replay import PolicySpec
from mainspring.billing.prices import PriceSheet
from mainspring.billing.simulator import BATCH_SLO_S, Simulation, ordered, simulate, usd
from mainspring.billing.trace import STABLE_KINDS, Segment, TraceRequest, content_hash

_RANK = {"tools": 0, "system": 1, "document": 2}  # everything else keeps its order, after these
EXTENDED: dict[str, dict[str, object]] = {"automatic_prefix": {"ttl_s": 86_400.0},
                                          "explicit_breakpoints": {"retention": "1h"},
                                          "disk_units": {"ttl_s": 86_400.0}}


@dataclass
class Proposal:
    rule: str
    advice: str
    deltas_u: dict[str, int] = field(default_factory=dict)  # policy -> after − before (negative saves)
    affected: int = 0  # requests changed

    def to_json(self) -> dict:
        return {"rule": self.rule, "advice": self.advice, "affected_requests": self.affected,
                "delta_usd": {p: usd(d) for p, d in self.deltas_u.items()}}


def _cache_total(sim: Simulation, policy: str, scenario: str = "cache") -> int:
    return sim.get(scenario, policy).totals.total_u


def _resim(trace: list[TraceRequest], specs: Sequence[PolicySpec], sheet: PriceSheet | None) -> Simulation:
    return simulate(trace, specs, sheet, scenarios=("no_cache", "cache"))


def _deltas(before: Simulation, after: Simulation, scenario: str = "cache") -> dict[str, int]:
    return {p: _cache_total(after, p, scenario) - _cache_total(before, p, scenario) for p in before.policies}


# ---- trace rewrites (each returns a new list; the input is never changed) ---------------------------
def _volatile_first(req: TraceRequest) -> bool:
    seen_volatile = False
    for s in req.segments:
        if s.kind in STABLE_KINDS and seen_volatile:
            return True
        seen_volatile |= s.kind not in STABLE_KINDS
    return False


def reorder(trace: Sequence[TraceRequest]) -> tuple[list[TraceRequest], int]:
    out, n = [], 0
    for r in trace:
        if _volatile_first(r):
            n += 1
            r = r.model_copy(update={"segments": sorted(r.segments, key=lambda s: _RANK.get(s.kind, 3))})
        out.append(r)
    return out, n


def shared_prefix(trace: Sequence[TraceRequest]) -> dict[int, int]:
    """Per request (by index): tokens of its leading stable segments that some other request of the
    same model also starts with."""
    starts: Counter[tuple[str, ...]] = Counter()
    leads = []
    for r in trace:
        lead = []
        for s in r.segments:
            if s.kind not in STABLE_KINDS:
                break
            lead.append(s)
        leads.append(lead)
        for k in range(1, len(lead) + 1):
            starts[(r.model, *(s.hash for s in lead[:k]))] += 1
    out = {}
    for i, (r, lead) in enumerate(zip(trace, leads)):
        k = max((k for k in range(1, len(lead) + 1) if starts[(r.model, *(s.hash for s in lead[:k]))] > 1),
                default=0)
        out[i] = sum(s.tokens for s in lead[:k])
    return out


def lengthen(trace: Sequence[TraceRequest], minimum: int) -> tuple[list[TraceRequest], int]:
    """Grow the last segment of each too-short shared stable prefix so the prefix reaches `minimum`.
    The grown segment gets a new hash derived from the old one, so requests that shared it still do."""
    shared = shared_prefix(trace)
    out, n = [], 0
    for i, r in enumerate(trace):
        have = shared[i]
        if 0 < have < minimum:
            segs, pos, acc = list(r.segments), 0, 0
            while acc < have:
                acc += segs[pos].tokens
                pos += 1
            last = segs[pos - 1]
            segs[pos - 1] = Segment(id=last.id, kind=last.kind, tokens=last.tokens + minimum - have,
                                    hash=content_hash(f"merged:{last.hash}:{minimum}"))
            r, n = r.model_copy(update={"segments": segs}), n + 1
        out.append(r)
    return out, n


def _expired_reuses(trace: Sequence[TraceRequest], ttl_s: float) -> int:
    """Requests whose stable prefix was last seen longer ago than the TTL (and was seen before)."""
    last: dict[tuple[str, ...], float] = {}
    n = 0
    for r in ordered(trace):
        key = (r.model, r.project, *(s.hash for s in r.segments if s.kind in STABLE_KINDS))
        if len(key) > 2 and key in last and r.t - last[key] > ttl_s:
            n += 1
        last[key] = r.t
    return n


def break_even_reads(write_multiplier: Decimal, read_multiplier: Decimal) -> int:
    """Reads after which a cache write has paid for itself: the write premium over reading savings."""
    return math.ceil((write_multiplier - 1) / (1 - read_multiplier)) if write_multiplier > 1 else 0


# ---- the rules --------------------------------------------------------------------------------------
def advise(trace: Sequence[TraceRequest], sim: Simulation, sheet: PriceSheet | None = None) -> list[Proposal]:
    """Proposals for `trace`, given its simulation `sim` (whose policies the deltas are measured on)."""
    requests = ordered(trace)
    specs = list(sim.specs.values())
    out: list[Proposal] = []

    def trace_rule(rule: str, advice: str, rewrite: Callable[[list[TraceRequest]], tuple[list, int]]) -> None:
        changed, n = rewrite(requests)
        if n:
            out.append(Proposal(rule, advice, _deltas(sim, _resim(changed, specs, sheet)), n))

    trace_rule("reorder", "put stable content first (tools → system → documents → history → this request's "
               "content): a volatile segment ahead of stable ones makes every request's prefix unique",
               reorder)
    minimum = max((s.min_tokens for s in specs), default=0)
    if minimum > 64:
        short = sum(1 for v in shared_prefix(requests).values() if 0 < v < minimum)
        trace_rule("merge", f"{short} requests share a stable prefix shorter than the {minimum:,}-token minimum of "
                   f"prefix caching: merge stable material (instructions, examples, tool docs) into it to reach "
                   f"{minimum:,} tokens", lambda t: lengthen(t, minimum))

    extendable = [s for s in specs if s.name in EXTENDED]
    expired = max((_expired_reuses(requests, s.ttl_s) for s in extendable if s.ttl_s < 86_400), default=0)
    if expired:
        longer = [s.with_(**EXTENDED[s.name]) if s.name in EXTENDED else s for s in specs]
        out.append(Proposal(
            "retention", f"{expired} requests reuse a prefix after its cache expired: use extended retention "
            f"(prompt_cache_retention=24h; Anthropic ttl=1h, whose 2× writes break even after "
            f"{break_even_reads(Decimal(2), Decimal('0.1'))} reads, 1.25× after "
            f"{break_even_reads(Decimal('1.25'), Decimal('0.1'))})",
            _deltas(sim, _resim(requests, longer, sheet)), expired))

    eligible = sum(1 for r in requests if r.latency_slo_s >= BATCH_SLO_S and r.tier != "batch")
    if eligible and ("cache_batch", specs[0].name) in sim.results:
        out.append(Proposal("batch", f"{eligible} requests can wait 24 h: send them through the Batch API (0.5×)",
                            {p: _cache_total(sim, p, "cache_batch") - _cache_total(sim, p) for p in sim.policies},
                            eligible))

    heavy = [p for p in sim.policies if (t := sim.get("cache", p).totals).total_u and t.output_u * 2 > t.total_u]
    if heavy:
        share = max(sim.get("cache", p).totals.output_u / sim.get("cache", p).totals.total_u for p in heavy)
        out.append(Proposal("output", f"output is up to {share:.0%} of the cost ({', '.join(heavy)}): caching only "
                            "discounts input, so shorter answers (max_tokens, terser prompts) or batch save more",
                            {}, 0))
    return out

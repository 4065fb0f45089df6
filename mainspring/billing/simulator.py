"""Cost simulator: what a recorded trace would cost under each cache policy and scenario.

    sim = simulate(read_trace("agent.jsonl"), sheet=load_price_sheet())
    sim.get("cache", "kv_blocks").hit_rate, sim.get("cache", "kv_blocks").total_factor

Every policy is priced with its own price table: the provider-like policies with the illustrative
presets below, `kv_blocks` (this server) with the loaded price sheet, exactly as the ledger would
(`prices.rates_for` + per-component micro-USD rounding). Scenarios:

- `no_cache`: every input token at the input price (the baseline of each policy's reductions);
- `cache`: the policy's hits and writes;
- `batch` / `cache_batch`: requests whose `latency_slo_s` ≥ 24 h move to the batch tier (0.5×);
  the others keep their tier;
- `fast`: every request on the high-speed tier (2×), with cache.

Money is integer micro-USD; reductions are factors (`no_cache / this`, 8.9 = "8.9× cheaper").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from typing import Iterable, Sequence

from mainspring.billing.cache_replay import POLICIES, Hit, PolicySpec, policy, replay
from mainspring.billing.prices import PriceSheet, UnknownTier, micro_usd, rates_for
from mainspring.billing.trace import TraceRequest

SCENARIOS = ("no_cache", "cache", "batch", "cache_batch", "fast")
BATCH_SLO_S = 86_400  # the batch window is 24 h: only requests that can wait that long qualify
D = Decimal


@dataclass(frozen=True)
class SimRates:
    """USD per 1M tokens (= micro-USD per token) of one model and tier."""

    input: Decimal
    cached_input: Decimal
    output: Decimal
    write_5m: Decimal
    write_1h: Decimal

    def scaled(self, k: Decimal) -> SimRates:
        return SimRates(self.input * k, self.cached_input * k, self.output * k, self.write_5m * k, self.write_1h * k)


@dataclass(frozen=True)
class Preset:
    """A flat price table: one rate card for every model of the trace, tiers as multipliers."""

    name: str
    standard: SimRates
    tiers: tuple[tuple[str, Decimal], ...] = (("standard", D(1)), ("fast", D(2)), ("batch", D("0.5")))
    source: str = ""

    def rates(self, model: str, tier: str, input_total: int) -> SimRates:
        return self.standard.scaled(dict(self.tiers)[tier])


# Illustrative list-price RATIOS in USD per 1M tokens, shaped like each provider's published prices
# when the design note (§1, §6) was written. They are NOT live prices and name no real model: they
# exist so the policies can be compared on one trace. Price real decisions with --prices.
PRESETS: dict[str, Preset] = {
    "openai_like": Preset("openai_like", SimRates(D("1.25"), D("0.125"), D("10.00"), D("1.25"), D("1.25")),
                          source="cached 0.1× input, output 8×, no write fee"),
    "anthropic_like": Preset("anthropic_like", SimRates(D("3.00"), D("0.30"), D("15.00"), D("3.75"), D("6.00")),
                             source="reads 0.1×, writes 1.25× (5 min) / 2× (1 h), output 5×"),
    "deepseek_like": Preset("deepseek_like", SimRates(D("0.28"), D("0.028"), D("0.42"), D("0.28"), D("0.28")),
                            source="cache hits 0.1× a miss, no write fee"),
}
DEFAULT_PRICES = {"automatic_prefix": "openai_like", "explicit_breakpoints": "anthropic_like",
                  "disk_units": "deepseek_like", "kv_blocks": "this_server"}


@dataclass(frozen=True)
class SheetPrices:
    """This server: the loaded price sheet, with its context tiers. A tier the model lacks falls back:
    fast → 2× standard; batch → standard (the request is simply not discounted)."""

    sheet: PriceSheet
    name: str = "this_server"

    def rates(self, model: str, tier: str, input_total: int) -> SimRates:
        try:
            r = rates_for(self.sheet, model, tier, input_total)
            k = D(1)
        except UnknownTier:
            r = rates_for(self.sheet, model, "standard", input_total)
            k = D(2) if tier == "fast" else D(1)
        return SimRates(r.input, r.cached_input, r.output, r.cache_write, r.cache_write).scaled(k)


PriceTable = Preset | SheetPrices


@dataclass
class Totals:
    """Tokens and micro-USD by class over a set of requests."""

    requests: int = 0
    input_total: int = 0
    uncached: int = 0
    cache_read: int = 0
    cache_write: int = 0
    output: int = 0
    uncached_u: int = 0
    cache_read_u: int = 0
    cache_write_u: int = 0
    output_u: int = 0

    @property
    def input_u(self) -> int:
        return self.uncached_u + self.cache_read_u + self.cache_write_u

    @property
    def total_u(self) -> int:
        return self.input_u + self.output_u


@dataclass
class Result:
    scenario: str
    policy: str
    prices: str
    totals: Totals
    baseline: Totals  # the same policy's prices, no cache, standard tiers: what reductions compare to

    @property
    def hit_rate(self) -> float:
        """Token-weighted: cache_read / input_total."""
        return self.totals.cache_read / self.totals.input_total if self.totals.input_total else 0.0

    @property
    def effective_input_price(self) -> float:
        """USD per 1M input tokens actually paid (list price × the mix of classes)."""
        t = self.totals
        return t.input_u / t.input_total if t.input_total else 0.0

    @property
    def input_factor(self) -> float:
        return self.baseline.input_u / self.totals.input_u if self.totals.input_u else float("inf")

    @property
    def total_factor(self) -> float:
        return self.baseline.total_u / self.totals.total_u if self.totals.total_u else float("inf")

    def to_json(self) -> dict:
        t = self.totals
        return {"scenario": self.scenario, "policy": self.policy, "prices": self.prices, "requests": t.requests,
                "tokens": {"input_total": t.input_total, "uncached": t.uncached, "cache_read": t.cache_read,
                           "cache_write": t.cache_write, "output": t.output},
                "cost_usd": {"uncached": usd(t.uncached_u), "cache_read": usd(t.cache_read_u),
                             "cache_write": usd(t.cache_write_u), "output": usd(t.output_u),
                             "input": usd(t.input_u), "total": usd(t.total_u)},
                "hit_rate": round(self.hit_rate, 4),
                "effective_input_usd_per_mtok": round(self.effective_input_price, 6),
                "input_reduction_x": _finite(self.input_factor), "total_reduction_x": _finite(self.total_factor)}


@dataclass
class Simulation:
    results: dict[tuple[str, str], Result] = field(default_factory=dict)
    specs: dict[str, PolicySpec] = field(default_factory=dict)

    def get(self, scenario: str, policy_name: str) -> Result:
        return self.results[(scenario, policy_name)]

    @property
    def policies(self) -> list[str]:
        return list(self.specs)

    def to_json(self) -> list[dict]:
        return [r.to_json() for r in self.results.values()]


def _finite(x: float) -> float | None:
    return round(x, 3) if x != float("inf") else None  # JSON has no infinity: "nothing left to pay"


def usd(micro: int) -> str:
    """Micro-USD as a dollar string, exact (no float on the way)."""
    return f"{D(micro) / D(1_000_000):.6f}"


def scenario_tier(scenario: str, req: TraceRequest) -> str:
    if scenario == "fast":
        return "fast"
    if scenario in ("batch", "cache_batch") and req.latency_slo_s >= BATCH_SLO_S:
        return "batch"
    return req.tier


def _add(tot: Totals, req: TraceRequest, hit: Hit, r: SimRates) -> None:
    tot.requests += 1
    tot.input_total += hit.input_total
    tot.uncached += hit.uncached
    tot.cache_read += hit.cache_read
    tot.cache_write += hit.cache_write
    tot.output += req.output_tokens
    # each component rounded on its own, as `prices.price` does for the ledger
    tot.uncached_u += micro_usd(hit.uncached, r.input)
    tot.cache_read_u += micro_usd(hit.cache_read, r.cached_input)
    tot.cache_write_u += micro_usd(hit.cache_write_5m, r.write_5m) + micro_usd(hit.cache_write_1h, r.write_1h)
    tot.output_u += micro_usd(req.output_tokens, r.output)


def price_replay(requests: Sequence[TraceRequest], hits: Sequence[Hit], prices: PriceTable,
                 scenario: str) -> Totals:
    tot = Totals()
    cached = scenario not in ("no_cache", "batch")
    for req, hit in zip(requests, hits):
        h = hit if cached else Hit(hit.input_total)
        _add(tot, req, h, prices.rates(req.model, scenario_tier(scenario, req), h.input_total))
    return tot


def price_table(policy_name: str, sheet: PriceSheet | None) -> PriceTable:
    name = DEFAULT_PRICES[policy_name]
    if name == "this_server":
        if sheet is None:
            raise ValueError("the kv_blocks policy prices with this server's price sheet; pass one")
        return SheetPrices(sheet)
    return PRESETS[name]


def ordered(trace: Iterable[TraceRequest]) -> list[TraceRequest]:
    return sorted(trace, key=lambda r: r.t)  # stable: equal times keep file order


def simulate(trace: Iterable[TraceRequest], policies: Sequence[str | PolicySpec] = POLICIES,
             sheet: PriceSheet | None = None, scenarios: Sequence[str] = SCENARIOS) -> Simulation:
    """Replay `trace` under each policy (a name, or a PolicySpec with changed parameters) and price
    every scenario. Raises ValueError for an unknown policy or scenario, PriceError for a model the
    sheet does not price."""
    requests = ordered(trace)
    bad = [s for s in scenarios if s not in SCENARIOS]
    if bad:
        raise ValueError(f"unknown scenario {bad[0]!r}; scenarios are {', '.join(SCENARIOS)}")
    sim = Simulation()
    for p in policies:
        spec = p if isinstance(p, PolicySpec) else policy(p)
        prices = price_table(spec.name, sheet)
        hits = replay(spec, requests)
        baseline = price_replay(requests, hits, prices, "no_cache")
        sim.specs[spec.name] = spec
        for sc in scenarios:
            totals = baseline if sc == "no_cache" else price_replay(requests, hits, prices, sc)
            sim.results[(sc, spec.name)] = Result(sc, spec.name, prices.name, totals, baseline)
    return sim

"""The cost simulator and its advisor on hand-built traces with known answers."""

from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mainspring.billing.advisor import advise, break_even_reads
from mainspring.billing.cache_replay import policy, replay
from mainspring.billing.prices import micro_usd, price
from mainspring.billing.simulator import PRESETS, simulate
from mainspring.billing.trace import Segment, TraceRequest
from mainspring.billing.usage import UsageRecord

MODEL = "SmolLM2-135M-Instruct"


def req(t: float, *segs: tuple[str, int, str], out: int = 10, slo: float = 0, project: str = "") -> TraceRequest:
    return TraceRequest(t=t, model=MODEL, project=project, output_tokens=out, latency_slo_s=slo,
                        segments=[Segment(id=f"s{i}", kind=k, tokens=n, hash=h) for i, (k, n, h) in enumerate(segs)])


def reads(name: str, trace: list[TraceRequest], **kw) -> list[int]:
    return [h.cache_read for h in replay(policy(name, **kw), trace)]


# ---- automatic_prefix --------------------------------------------------------------------------------
def test_automatic_shared_system_prompt_is_read_whole():
    trace = [req(0, ("system", 2048, "S"), ("user", 30, "u1")), req(10, ("system", 2048, "S"), ("user", 40, "u2"))]
    assert reads("automatic_prefix", trace) == [0, 2048]


def test_automatic_below_minimum_never_hits_and_hits_come_in_128s():
    short = [req(i, ("system", 900, "S"), ("user", 30, f"u{i}")) for i in range(3)]
    assert reads("automatic_prefix", short) == [0, 0, 0]
    odd = [req(i, ("system", 2000, "S"), ("user", 30, f"u{i}")) for i in range(2)]
    assert reads("automatic_prefix", odd) == [0, 1920]  # 15 × 128: the common prefix rounded down


def test_automatic_ttl_expiry_and_refresh():
    a, b = ("system", 2048, "S"), ("user", 30, "u")
    assert reads("automatic_prefix", [req(0, a, b), req(301, a, b)]) == [0, 0]  # 5 min idle: gone
    assert reads("automatic_prefix", [req(0, a, b), req(299, a, b)]) == [0, 2048]
    # each hit refreshes the entry, so a steady 4-minute rhythm never expires
    assert reads("automatic_prefix", [req(240 * i, a, b) for i in range(4)]) == [0, 2048, 2048, 2048]
    assert reads("automatic_prefix", [req(0, a, b), req(3600, a, b)], ttl_s=86_400) == [0, 2048]


# ---- kv_blocks ---------------------------------------------------------------------------------------
def test_kv_blocks_counts_only_full_blocks():
    trace = [req(0, ("system", 40, "S"), ("user", 5, "u1")), req(1, ("system", 40, "S"), ("user", 5, "u2"))]
    assert reads("kv_blocks", trace) == [0, 32]  # 40 shared tokens = 2 full blocks; the third is half foreign
    same = [req(0, ("system", 48, "S")), req(1, ("system", 48, "S"))]
    assert reads("kv_blocks", same) == [0, 32]  # the last prompt token is always computed: 47 → 2 blocks


def test_kv_blocks_lru_under_capacity():
    a, b = ("system", 64, "A"), ("system", 64, "B")
    trace = [req(0, a), req(1, b), req(2, a)]
    assert reads("kv_blocks", trace, capacity_tokens=100) == [0, 0, 0]  # B pushed A out
    assert reads("kv_blocks", trace, capacity_tokens=128) == [0, 0, 48]
    # A was used last, so B goes when C arrives, and A still hits
    trace = [req(0, a), req(1, b), req(2, a), req(3, ("system", 64, "C")), req(4, a), req(5, b)]
    assert reads("kv_blocks", trace, capacity_tokens=128) == [0, 0, 48, 0, 48, 0]


def test_kv_blocks_evicts_deepest_first():
    # a shared 64-token prefix with two tails; evicting a tail must keep the prefix hittable
    s = ("system", 64, "S")
    trace = [req(0, s, ("user", 32, "x")), req(1, s, ("user", 32, "y")), req(2, s, ("user", 32, "z"))]
    assert reads("kv_blocks", trace, capacity_tokens=128) == [0, 64, 64]


# ---- explicit_breakpoints and disk_units -------------------------------------------------------------
def test_explicit_breakpoints_write_then_read():
    trace = [req(0, ("system", 2048, "S"), ("user", 30, "u1")), req(10, ("system", 2048, "S"), ("user", 40, "u2"))]
    hits = replay(policy("explicit_breakpoints"), trace)
    assert [(h.cache_read, h.cache_write_5m, h.uncached) for h in hits] == [(0, 2078, 0), (2048, 40, 0)]
    one_hour = replay(policy("explicit_breakpoints", retention="1h"), [*trace, req(3000, ("system", 2048, "S"))])
    assert [h.cache_write_1h for h in one_hour] == [2078, 40, 0] and one_hour[2].cache_read == 2048
    sim = simulate(trace, ["explicit_breakpoints"])
    t = sim.get("cache", "explicit_breakpoints").totals
    assert t.cache_write_u == micro_usd(2078, Decimal("3.75")) + micro_usd(40, Decimal("3.75"))  # 1.25 × 3.00
    assert t.cache_read_u == micro_usd(2048, Decimal("0.30"))


def test_explicit_breakpoints_multi_turn_reads_previous_turn():
    s, u1, a1, u2 = ("system", 1500, "S"), ("user", 100, "u1"), ("history", 50, "a1"), ("user", 20, "u2")
    trace = [req(0, s, u1), req(5, s, ("history", 100, "u1"), a1, u2)]
    hits = replay(policy("explicit_breakpoints"), trace)
    assert hits[1].cache_read == 1600 and hits[1].cache_write_5m == 70


def test_disk_units_round_inside_stable_content_but_not_at_turn_ends():
    trace = [req(0, ("system", 100, "S"), ("user", 30, "u1")), req(1, ("system", 100, "S"), ("user", 30, "u2"))]
    assert reads("disk_units", trace) == [0, 64]
    turns = [req(0, ("system", 100, "S"), ("user", 30, "u1")),
             req(1, ("system", 100, "S"), ("history", 30, "u1"), ("history", 20, "a1"), ("user", 10, "u2"))]
    assert reads("disk_units", turns) == [0, 130]


# ---- scenarios and pricing ---------------------------------------------------------------------------
def test_batch_scenario_halves_only_eligible_requests(sheet):
    trace = [req(0, ("user", 1000, "a"), out=100), req(1, ("user", 1000, "b"), out=100, slo=86_400),
             req(2, ("user", 1000, "c"), out=100, slo=3_600)]
    sim = simulate(trace, ["automatic_prefix", "kv_blocks"], sheet)
    one = micro_usd(1000, Decimal("1.25")) + micro_usd(100, Decimal("10"))
    assert sim.get("no_cache", "automatic_prefix").totals.total_u == 3 * one
    assert sim.get("batch", "automatic_prefix").totals.total_u == 2 * one + one // 2
    kv = sim.get("batch", "kv_blocks").totals
    assert kv.total_u == 2 * (100 + 40) + (50 + 20)  # sheet: 0.10 in / 0.40 out per 1M; batch tier 0.5×
    assert sim.get("fast", "automatic_prefix").totals.total_u == 6 * one


def test_kv_blocks_prices_like_the_ledger(sheet):
    trace = [req(0, ("system", 5000, "S"), ("user", 77, "u1"), out=33),
             req(1, ("system", 5000, "S"), ("user", 91, "u2"), out=41)]
    sim = simulate(trace, ["kv_blocks"], sheet)
    hits = replay(policy("kv_blocks"), trace)
    ledger = sum(price(UsageRecord(MODEL, input_total=h.input_total, cache_read=h.cache_read,
                                   output_total=r.output_tokens), sheet).total_u for r, h in zip(trace, hits))
    res = sim.get("cache", "kv_blocks")
    assert res.totals.total_u == ledger
    assert res.hit_rate == pytest.approx(hits[1].cache_read / (5077 + 5091))
    assert res.input_factor > 1 and res.total_factor > 1


def test_output_only_trace_and_unknown_names(sheet):
    sim = simulate([req(0, ("user", 0, "e"), out=5)], ["kv_blocks"], sheet)
    assert sim.get("cache", "kv_blocks").hit_rate == 0.0
    with pytest.raises(ValueError, match="unknown cache policy"):
        simulate([req(0, ("user", 1, "e"))], ["lru"])
    with pytest.raises(ValueError, match="unknown scenario"):
        simulate([req(0, ("user", 1, "e"))], ["automatic_prefix"], scenarios=["cheap"])


segment = st.tuples(st.sampled_from(["system", "user", "history"]), st.integers(0, 3000), st.sampled_from("ABCDE"))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2000), st.lists(segment, min_size=1, max_size=5)), min_size=1, max_size=12))
def test_token_classes_add_up_and_free_writes_never_cost_more(raw):
    trace = sorted((req(t, *segs) for t, segs in raw), key=lambda r: r.t)
    for name in ("automatic_prefix", "explicit_breakpoints", "disk_units", "kv_blocks"):
        for r, h in zip(trace, replay(policy(name, capacity_tokens=4000), trace)):
            assert 0 <= h.cache_read <= h.input_total == r.input_tokens and h.uncached >= 0
    sim = simulate(trace, ["automatic_prefix", "disk_units"])
    for p in ("automatic_prefix", "disk_units"):
        assert sim.get("cache", p).totals.total_u <= sim.get("no_cache", p).totals.total_u


def test_reproduces_the_design_note_figures():
    """Design note §6, row 1: 50k shared prefix, 200-token suffix, 300 out, N=100 within the TTL."""
    trace = [req(i, ("system", 50_000, "S"), ("user", 200, f"u{i}"), out=300) for i in range(100)]
    sim = simulate(trace, ["automatic_prefix", "explicit_breakpoints"])
    auto, ant = sim.get("cache", "automatic_prefix"), sim.get("cache", "explicit_breakpoints")
    assert auto.hit_rate == pytest.approx(0.986, abs=0.002)  # 128-token increments: 49,920 of 50,000 read
    assert (round(auto.input_factor, 1), round(auto.total_factor, 1)) == (8.8, 6.5)  # note: 8.9 / 6.5
    assert (round(ant.hit_rate, 3), round(ant.total_factor, 1)) == (0.986, 7.1)
    volatile = [req(i, ("user", 20, f"clock{i}"), ("system", 50_000, "S"), ("user", 200, f"u{i}"), out=300)
                for i in range(100)]
    assert simulate(volatile, ["automatic_prefix"]).get("cache", "automatic_prefix").total_factor == 1.0


# ---- advisor -----------------------------------------------------------------------------------------
def _rules(trace, policies=("automatic_prefix", "explicit_breakpoints"), sheet=None):
    sim = simulate(trace, list(policies), sheet)
    return {p.rule: p for p in advise(trace, sim, sheet)}, sim


def test_reorder_volatile_header_first_saves_money():
    trace = [req(60 * i, ("user", 20, f"clock{i}"), ("system", 4000, "S"), ("user", 50, f"q{i}")) for i in range(6)]
    rules, sim = _rules(trace)
    assert sim.get("cache", "automatic_prefix").hit_rate == 0.0
    assert rules["reorder"].affected == 6
    assert all(d < 0 for d in rules["reorder"].deltas_u.values())


def test_merge_lengthens_a_prefix_below_the_minimum():
    trace = [req(10 * i, ("system", 900, "S"), ("user", 50, f"q{i}")) for i in range(10)]
    rules, _ = _rules(trace, ("automatic_prefix",))
    assert rules["merge"].deltas_u["automatic_prefix"] < 0  # more tokens, yet cheaper: they are cached now


def test_retention_when_reuse_gaps_exceed_the_ttl():
    trace = [req(600 * i, ("system", 3000, "S"), ("user", 50, f"q{i}")) for i in range(6)]
    rules, _ = _rules(trace)
    assert rules["retention"].affected == 5
    assert rules["retention"].deltas_u["automatic_prefix"] < 0
    assert rules["retention"].deltas_u["explicit_breakpoints"] < 0  # 5 reads pay for 2× writes
    assert break_even_reads(Decimal(2), Decimal("0.1")) == 2 and break_even_reads(Decimal("1.25"),
                                                                                  Decimal("0.1")) == 1


def test_batch_and_output_rules():
    trace = [req(i, ("user", 100, f"q{i}"), out=2000, slo=86_400 * (i % 2)) for i in range(4)]
    rules, _ = _rules(trace, ("automatic_prefix",))
    assert rules["batch"].affected == 2 and rules["batch"].deltas_u["automatic_prefix"] < 0
    assert "output" in rules and "reorder" not in rules and "retention" not in rules


def test_advisor_never_changes_the_callers_trace():
    trace = [req(60 * i, ("user", 20, f"clock{i}"), ("system", 4000, "S")) for i in range(3)]
    before = [r.model_dump() for r in trace]
    _rules(trace)
    assert [r.model_dump() for r in trace] == before


def test_presets_are_list_ratios():
    assert PRESETS["anthropic_like"].standard.write_5m == PRESETS["anthropic_like"].standard.input * Decimal("1.25")
    for p in PRESETS.values():
        assert p.standard.cached_input == p.standard.input / 10


# ---- `mainspring sim` --------------------------------------------------------------------------------
def test_sim_command_tables_json_and_bad_trace(tmp_path):
    import json

    from typer.testing import CliRunner

    from mainspring.billing.trace import write_trace
    from mainspring.cli import app

    path = tmp_path / "t.jsonl"
    write_trace(path, [req(60 * i, ("user", 20, f"clock{i}"), ("system", 4000, "S")) for i in range(3)])
    runner = CliRunner()
    res = runner.invoke(app, ["sim", str(path)])
    assert res.exit_code == 0, res.output
    assert "kv_blocks" in res.output and "reorder" in res.output and "hit rate" in res.output
    res = runner.invoke(app, ["sim", str(path), "--policy", "automatic_prefix", "--json"])
    data = json.loads(res.output)
    assert {r["scenario"] for r in data["results"]} == {"no_cache", "cache", "batch", "cache_batch", "fast"}
    assert data["advice"][0]["rule"] == "reorder" and data["advice"][0]["delta_usd"]["automatic_prefix"][0] == "-"
    path.write_text(path.read_text() + "{oops\n")
    res = runner.invoke(app, ["sim", str(path)])
    assert res.exit_code == 2 and "line 4" in res.output
    res = runner.invoke(app, ["sim", str(path), "--policy", "lru"])
    assert res.exit_code == 2 and "--policy" in res.output

"""billing/usage: one record, two wire views, and the property that both views bill the same."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mainspring.billing.prices import load_price_sheet, parse_price_sheet, price
from mainspring.billing.usage import UsageRecord, from_anthropic, from_engine, from_openai
from mainspring.engine.outputs import Usage

SMOL = "SmolLM2-135M-Instruct"


def test_from_engine_usage():
    rec = from_engine(Usage(prompt_tokens=2006, cached_tokens=1920, completion_tokens=300), SMOL, "fast",
                      stream=True, finish_reason="stop")
    assert (rec.input_total, rec.cache_read, rec.cache_write, rec.output_total) == (2006, 1920, 0, 300)
    assert rec.input_uncached == 86 and rec.tier == "fast" and rec.stream and rec.finish_reason == "stop"
    assert rec.total_tokens == 2306


def test_views():
    rec = UsageRecord(model=SMOL, input_total=2006, cache_read=1920, cache_write=6, output_total=300, reasoning=40)
    assert rec.to_openai() == {
        "prompt_tokens": 2006, "completion_tokens": 300, "total_tokens": 2306,
        "prompt_tokens_details": {"cached_tokens": 1920, "cache_write_tokens": 6},
        "completion_tokens_details": {"reasoning_tokens": 40},
    }
    assert rec.to_anthropic() == {"input_tokens": 80, "cache_read_input_tokens": 1920,
                                  "cache_creation_input_tokens": 6, "output_tokens": 300, "service_tier": "standard"}
    assert "cache_write_tokens" not in rec.with_(cache_write=0).to_openai()["prompt_tokens_details"]
    assert rec.with_(tier="fast").to_anthropic()["service_tier"] == "priority"


def test_anthropic_cached_tokens_are_not_billed_twice():
    # Anthropic's input_tokens EXCLUDES cache reads: adding them again is the classic 6× overcharge
    sheet = load_price_sheet()
    rec = from_anthropic({"input_tokens": 100, "cache_read_input_tokens": 100_000, "output_tokens": 10}, SMOL)
    assert (rec.input_total, rec.input_uncached, rec.cache_read) == (100_100, 100, 100_000)
    assert price(rec, sheet).total_u == 10 + 1000 + 4  # 100×0.10 + 100k×0.01 + 10×0.40
    # ...while OpenAI's prompt_tokens INCLUDES them
    oai = from_openai({"prompt_tokens": 100_100, "completion_tokens": 10,
                       "prompt_tokens_details": {"cached_tokens": 100_000}}, SMOL)
    assert price(oai, sheet) == price(rec, sheet)


def test_parsers_accept_real_payload_shapes():
    # nulls and missing details, as real providers send them
    r = from_openai({"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15,
                     "prompt_tokens_details": None, "completion_tokens_details": {"reasoning_tokens": None}}, SMOL)
    assert (r.input_total, r.cache_read, r.output_total, r.reasoning) == (12, 0, 3, 0)
    # Responses API names
    r = from_openai({"input_tokens": 50, "output_tokens": 7, "input_tokens_details": {"cached_tokens": 32},
                     "output_tokens_details": {"reasoning_tokens": 2}}, SMOL)
    assert (r.input_total, r.cache_read, r.output_total, r.reasoning) == (50, 32, 7, 2)
    # Anthropic: only the 5m/1h split of the cache write, and the service tier
    r = from_anthropic({"input_tokens": 5, "cache_creation": {"ephemeral_5m_input_tokens": 10,
                                                              "ephemeral_1h_input_tokens": 20},
                        "output_tokens": 1, "service_tier": "batch"}, SMOL)
    assert (r.input_total, r.cache_write, r.tier) == (35, 30, "batch")
    assert from_anthropic({"input_tokens": 1, "service_tier": "priority"}, SMOL).tier == "fast"


def test_bad_counts_are_refused():
    with pytest.raises(ValueError, match="input_total"):
        UsageRecord(model=SMOL, input_total=-1)
    with pytest.raises(ValueError, match="prompt_tokens"):
        from_openai({"prompt_tokens": "12", "completion_tokens": 1}, SMOL)
    # an upstream reporting more cached than total tokens gets no credit for it
    assert UsageRecord(model=SMOL, input_total=10, cache_read=20).input_uncached == 0


SHEET = parse_price_sheet({
    "schema": "price-sheet/v1", "version": "prop.1",
    "models": {"m": {"context_window": 1_000_000, "max_output_tokens": 100_000,
                     "tiers": {"standard": {"input": "3.00", "cached_input": "0.30", "output": "15.00"},
                               "fast": {"input": "6.00", "cached_input": "0.60", "output": "30.00",
                                        "cache_write": "7.50"},
                               "batch": {"derive_from": "standard", "multiplier": "0.5",
                                         "applies_to": ["input", "cached_input", "output", "cache_write"]}},
                     "context_tiers": [{"above_input_tokens": 200_000, "multiplier": "2"}],
                     "cache": {"write_multiplier": {"default": "1.25"}}},
               SMOL: load_price_sheet().models[SMOL].model_dump()},
})


@st.composite
def usage_records(draw):
    uncached, read, write = (draw(st.integers(0, 400_000)) for _ in range(3))
    out = draw(st.integers(0, 100_000))
    return UsageRecord(model=draw(st.sampled_from(["m", SMOL])),
                       tier=draw(st.sampled_from(["standard", "fast", "batch"])),
                       input_total=uncached + read + write, cache_read=read, cache_write=write, output_total=out,
                       reasoning=draw(st.integers(0, out)))


@settings(max_examples=300, deadline=None)
@given(usage_records())
def test_openai_and_anthropic_views_price_the_same(rec):
    via_openai = from_openai(rec.to_openai(), rec.model, rec.tier)
    via_anthropic = from_anthropic(rec.to_anthropic(), rec.model)  # tier read back from service_tier
    assert via_openai == rec
    assert via_anthropic == rec.with_(reasoning=0)  # Anthropic has no separate reasoning count
    assert price(via_openai, SHEET) == price(via_anthropic, SHEET) == price(rec, SHEET)

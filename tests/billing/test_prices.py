"""billing/prices: the YAML sheet, micro-USD pricing and rounding, LiteLLM import/export."""

from decimal import Decimal

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from mainspring.billing.prices import (
    DEFAULT_SHEET,
    PriceError,
    UnknownModel,
    UnknownTier,
    from_litellm,
    load_price_sheet,
    micro_usd,
    parse_price_sheet,
    price,
    to_litellm,
    usd_to_micro,
)
from mainspring.billing.usage import UsageRecord
from mainspring.config import Settings

SMOL = "SmolLM2-135M-Instruct"


def sheet_dict(**model_over):
    m = {"context_window": 131072, "max_output_tokens": 16384,
         "tiers": {"standard": {"input": "2.00", "cached_input": "0.20", "output": "8.00"},
                   "fast": {"input": "4.00", "cached_input": "0.40", "output": "16.00"},
                   "batch": {"derive_from": "standard", "multiplier": "0.5"}},
         "context_tiers": [{"above_input_tokens": 200000, "multiplier": "2.0"}],
         "cache": {"mode": "automatic_prefix", "min_prefix_tokens": 1024, "increment_tokens": 128,
                   "write_multiplier": {"default": "1.25"}, "read_multiplier": "0.1"}}
    m.update(model_over)
    return {"schema": "price-sheet/v1", "version": "2025-06-01.1", "models": {"atlas-1": m}}


def test_builtin_sheet_prices_the_embedded_model():
    sheet = load_price_sheet(None)
    assert sheet == load_price_sheet(Settings().prices_file or None) == load_price_sheet(DEFAULT_SHEET)
    std, fast, batch = (sheet.rates(SMOL, t) for t in ("standard", "fast", "batch"))
    assert (std.input, std.cached_input, std.output) == (Decimal("0.10"), Decimal("0.01"), Decimal("0.40"))
    assert (fast.input, fast.cached_input, fast.output) == (2 * std.input, 2 * std.cached_input, 2 * std.output)
    assert (batch.input, batch.cached_input, batch.output) == (std.input / 2, std.cached_input / 2, std.output / 2)
    assert sheet.rates(SMOL + "-fast", "standard").output == Decimal("0.80")
    assert sheet.model(SMOL).max_output_tokens > 0 and sheet.model(SMOL).context_window >= 2048


def test_price_components_in_micro_usd():
    sheet = parse_price_sheet(sheet_dict())
    # OpenAI-style example: 2006 prompt tokens of which 1920 cached, 300 out
    rec = UsageRecord(model="atlas-1", input_total=2006, cache_read=1920, output_total=300)
    c = price(rec, sheet)
    assert (c.input_u, c.cache_read_u, c.cache_write_u, c.output_u) == (86 * 2, 384, 0, 2400)
    assert c.total_u == 172 + 384 + 2400 and c.price_sheet_version == "2025-06-01.1"
    # cache writes default to input × write_multiplier (1.25 here)
    w = price(UsageRecord(model="atlas-1", input_total=1000, cache_write=1000), sheet)
    assert (w.input_u, w.cache_write_u) == (0, 2500)
    assert price(rec.with_(tier="batch"), sheet).total_u == c.total_u // 2
    assert price(rec.with_(tier="fast"), sheet).total_u == 2 * c.total_u
    assert c.to_api()["total"] == "0.002956" and c.to_api()["currency"] == "USD"


def test_rounding_is_half_up_per_component():
    assert micro_usd(5, Decimal("0.10")) == 1  # 0.5 -> 1 (banker's rounding would give 0)
    assert micro_usd(15, Decimal("0.10")) == 2  # 1.5 -> 2
    assert micro_usd(14, Decimal("0.10")) == 1
    sheet = load_price_sheet()
    c = price(UsageRecord(model=SMOL, input_total=10, cache_read=5, output_total=1), sheet)
    # 5 × 0.10 = 0.5 -> 1; 5 × 0.01 = 0.05 -> 0; 1 × 0.40 -> 0; total is the sum of the rounded parts
    assert (c.input_u, c.cache_read_u, c.output_u, c.total_u) == (1, 0, 0, 1)
    assert usd_to_micro("5.00") == 5_000_000 and usd_to_micro("0.0000005") == 1


def test_context_tier_multiplies_long_prompts():
    sheet = parse_price_sheet(sheet_dict())
    short = price(UsageRecord(model="atlas-1", input_total=200000), sheet)
    long = price(UsageRecord(model="atlas-1", input_total=200001), sheet)
    assert short.input_u == 400000 and long.input_u == 800004


def test_cached_input_is_its_own_price_never_a_fixed_discount():
    d = sheet_dict(tiers={"standard": {"input": "1.00", "cached_input": "1.00", "output": "1.00"}})
    c = price(UsageRecord(model="atlas-1", input_total=1000, cache_read=1000), parse_price_sheet(d))
    assert c.cache_read_u == 1000


def test_unknown_model_and_tier_are_clear_errors():
    sheet = load_price_sheet()
    with pytest.raises(UnknownModel, match="no price for model 'gpt-9'.*SmolLM2-135M-Instruct"):
        price(UsageRecord(model="gpt-9", input_total=1), sheet)
    with pytest.raises(UnknownTier, match="has no 'batch' tier"):
        sheet.rates(SMOL + "-fast", "batch")
    assert issubclass(UnknownModel, PriceError) and issubclass(PriceError, ValueError)


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d["models"]["atlas-1"]["tiers"]["standard"].update(input=2.0), "quoted decimal string"),
    (lambda d: d["models"]["atlas-1"]["tiers"]["standard"].update(output="-1"), ">= 0"),
    (lambda d: d["models"]["atlas-1"]["tiers"].pop("standard"), "standard"),
    (lambda d: d["models"]["atlas-1"]["tiers"]["batch"].update(derive_from="nope"), "not a priced tier"),
    (lambda d: d.update(schema="price-sheet/v9"), "schema"),
    (lambda d: d["models"]["atlas-1"]["tiers"].update(turbo=d["models"]["atlas-1"]["tiers"]["fast"]), "turbo"),
])
def test_bad_sheets_name_the_problem(mutate, message):
    d = sheet_dict()
    mutate(d)
    with pytest.raises(PriceError, match=message):
        parse_price_sheet(d)


def test_load_from_file_and_bad_files(tmp_path):
    p = tmp_path / "prices.yaml"
    p.write_text(yaml.safe_dump(sheet_dict()))
    assert load_price_sheet(p).models["atlas-1"].cache.min_prefix_tokens == 1024
    with pytest.raises(PriceError, match="cannot read"):
        load_price_sheet(tmp_path / "missing.yaml")
    (tmp_path / "bad.yaml").write_text("models: [unclosed")
    with pytest.raises(PriceError, match="not valid YAML"):
        load_price_sheet(tmp_path / "bad.yaml")
    (tmp_path / "float.yaml").write_text(p.read_text().replace("'2.00'", "2.00"))
    with pytest.raises(PriceError, match="quoted"):
        load_price_sheet(tmp_path / "float.yaml")


def test_litellm_import_uses_litellm_field_names():
    gpt4o = {"input_cost_per_token": 2.5e-06, "output_cost_per_token": 1e-05, "cache_read_input_token_cost": 1.25e-06,
             "input_cost_per_token_batches": 1.25e-06, "output_cost_per_token_batches": 5e-06,
             "max_input_tokens": 128000, "max_output_tokens": 16384, "litellm_provider": "openai", "mode": "chat"}
    nocache = {"input_cost_per_token": 1e-06, "output_cost_per_token": 2e-06, "max_tokens": 4096, "mode": "chat"}
    image = {"output_cost_per_image": 0.04, "mode": "image_generation"}
    sheet = from_litellm({"gpt-4o": gpt4o, "plain": nocache, "dall-e": image, "sample_spec": {}}, version="litellm.1")
    assert set(sheet.models) == {"gpt-4o", "plain"}
    r = sheet.rates("gpt-4o")
    assert (r.input, r.cached_input, r.output) == (Decimal("2.5"), Decimal("1.25"), Decimal("10"))
    assert sheet.rates("gpt-4o", "batch").output == Decimal("5")
    assert sheet.model("gpt-4o").context_window == 128000 and sheet.model("gpt-4o").source == "litellm:openai"
    assert sheet.rates("plain").cached_input == Decimal("1")  # no read price: no discount, not a guessed 0.1
    with pytest.raises(PriceError, match="dall-e"):
        from_litellm({"dall-e": image}, version="x", models=["dall-e"])
    with pytest.raises(UnknownModel):
        from_litellm({"gpt-4o": gpt4o}, version="x", models=["gpt-5"])


def test_litellm_export_fields():
    out = to_litellm(load_price_sheet())[SMOL]
    assert out["input_cost_per_token"] == pytest.approx(1e-07)
    assert out["cache_read_input_token_cost"] == pytest.approx(1e-08)
    assert out["output_cost_per_token"] == pytest.approx(4e-07)
    assert out["input_cost_per_token_batches"] == pytest.approx(5e-08)
    assert out["output_cost_per_token_priority"] == pytest.approx(8e-07)
    assert out["max_input_tokens"] == 8192 and out["mode"] == "chat" and out["litellm_provider"] == "mainspring"


records = st.builds(
    lambda unc, read, write, out, model, tier: UsageRecord(model=model, tier=tier, input_total=unc + read + write,
                                                            cache_read=read, cache_write=write, output_total=out),
    st.integers(0, 300_000), st.integers(0, 300_000), st.integers(0, 50_000), st.integers(0, 100_000),
    st.just("atlas-1"), st.sampled_from(["standard", "fast", "batch"]),
)


@settings(max_examples=200, deadline=None)
@given(records)
def test_litellm_round_trip_prices_the_same(rec):
    sheet = parse_price_sheet(sheet_dict(context_tiers=[]))  # context tiers are not exported
    back = from_litellm(to_litellm(sheet), version=sheet.version)
    assert price(rec, back) == price(rec, sheet)

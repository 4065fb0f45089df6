"""Versioned price sheets (YAML, schema price-sheet/v1) and pricing a usage record in micro-USD.

A price is a decimal string in USD per 1M tokens, which is exactly micro-USD per token, so
`cost_u = tokens × price`. Each component (uncached input, cache read, cache write, output) is
rounded half up to a whole micro-USD on its own and the total is the sum of the rounded components:
the ledger's columns then always add up, and a request is never billed a fraction of a micro-USD.

`cached_input` is always its own price: a sheet never falls back to a hard-coded read discount
(the most reported mis-billing, see the design note §4.1).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from mainspring.billing.usage import UsageRecord

DEFAULT_SHEET = Path(__file__).resolve().parent / "default_prices.yaml"
TIERS = ("standard", "fast", "batch")
PRICE_FIELDS = ("input", "cached_input", "output", "cache_write")
MICRO = Decimal(1_000_000)


class PriceError(ValueError):
    """A price sheet that cannot be read, or a request that it cannot price."""


class UnknownModel(PriceError):
    def __init__(self, model: str, known: list[str]):
        self.model, self.known = model, known
        super().__init__(f"no price for model {model!r}; the price sheet has: {', '.join(sorted(known)) or 'none'}")


class UnknownTier(PriceError):
    def __init__(self, model: str, tier: str, known: list[str]):
        self.model, self.tier, self.known = model, tier, known
        super().__init__(f"model {model!r} has no {tier!r} tier; it has: {', '.join(known)}")


def _decimal(v: Any) -> Decimal:
    # Floats are refused: YAML reads an unquoted 0.10 as a binary float, the first step to billing errors.
    if isinstance(v, bool) or isinstance(v, float):
        raise ValueError(f"price {v!r} must be a quoted decimal string, e.g. \"0.10\"")
    try:
        d = Decimal(str(v))
    except Exception:
        raise ValueError(f"price {v!r} is not a decimal number") from None
    if not d.is_finite() or d < 0:
        raise ValueError(f"price {v!r} must be a finite number >= 0")
    return d


Price = Annotated[Decimal, BeforeValidator(_decimal)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TierPrices(_Strict):
    input: Price
    cached_input: Price
    output: Price
    cache_write: Price | None = None  # default: input × cache.write_multiplier.default


class DerivedTier(_Strict):
    derive_from: str
    multiplier: Price
    applies_to: list[Literal["input", "cached_input", "output", "cache_write"]] = ["input", "cached_input", "output"]
    window: str | None = None


class ContextTier(_Strict):
    above_input_tokens: int = Field(ge=0)
    multiplier: Price


class CachePolicy(BaseModel):
    # Only the multipliers are used for pricing; the rest describes the policy (and the simulator reads it).
    model_config = ConfigDict(extra="allow", frozen=True)
    mode: str = "automatic_prefix"
    min_prefix_tokens: int = Field(0, ge=0)
    increment_tokens: int = Field(1, ge=1)
    retention: dict[str, str] = {}
    write_multiplier: dict[str, Price] = {"default": Decimal(1)}
    read_multiplier: Price | None = None  # informational: cached_input is the price that bills


class ModelPrices(_Strict):
    context_window: int = Field(gt=0)
    max_output_tokens: int = Field(gt=0)
    tiers: dict[str, TierPrices | DerivedTier]
    context_tiers: list[ContextTier] = []
    cache: CachePolicy = CachePolicy()
    source: str = ""

    @model_validator(mode="after")
    def _tiers_resolve(self) -> ModelPrices:
        if "standard" not in self.tiers:
            raise ValueError("every model needs a 'standard' tier")
        for name, t in self.tiers.items():
            if name not in TIERS:
                raise ValueError(f"unknown tier {name!r}; tiers are {', '.join(TIERS)}")
            if isinstance(t, DerivedTier) and not isinstance(self.tiers.get(t.derive_from), TierPrices):
                raise ValueError(f"tier {name!r} derives from {t.derive_from!r}, which is not a priced tier")
        return self


class PriceSheet(_Strict):
    schema_: Literal["price-sheet/v1"] = Field("price-sheet/v1", alias="schema")
    version: str = Field(min_length=1, max_length=64)
    currency: Literal["USD"] = "USD"
    unit: Literal["per_1m_tokens"] = "per_1m_tokens"
    models: dict[str, ModelPrices]

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    def model(self, name: str) -> ModelPrices:
        """The model's prices; a fine-tuned model ("ft:<base>:...") the sheet does not name is priced as its base."""
        m = self.models.get(name)
        if m is None and name.startswith("ft:"):
            m = self.models.get(name.split(":", 2)[1])
        if m is None:
            raise UnknownModel(name, list(self.models))
        return m

    def rates(self, model: str, tier: str = "standard") -> Rates:
        """Concrete prices (USD per 1M tokens = micro-USD per token) for one model and tier."""
        m = self.model(model)
        t = m.tiers.get(tier)
        if t is None:
            raise UnknownTier(model, tier, list(m.tiers))
        if isinstance(t, DerivedTier):
            base: TierPrices = m.tiers[t.derive_from]  # type: ignore[assignment]
            vals = {f: getattr(base, f) for f in PRICE_FIELDS}
            for f in t.applies_to:
                if vals[f] is not None:
                    vals[f] = vals[f] * t.multiplier
        else:
            vals = {f: getattr(t, f) for f in PRICE_FIELDS}
        if vals["cache_write"] is None:
            vals["cache_write"] = vals["input"] * m.cache.write_multiplier.get("default", Decimal(1))
        return Rates(**vals)

    def body_json(self) -> str:
        """Canonical JSON of the sheet (what `price_sheets.body_json` stores)."""
        return json.dumps(self.model_dump(mode="json", by_alias=True, exclude_none=True), sort_keys=True)


@dataclass(frozen=True)
class Rates:
    input: Decimal
    cached_input: Decimal
    output: Decimal
    cache_write: Decimal

    def scaled(self, k: Decimal) -> Rates:
        return Rates(self.input * k, self.cached_input * k, self.output * k, self.cache_write * k)


@dataclass(frozen=True)
class Cost:
    """What one request cost, per component, in integer micro-USD (1 USD = 1_000_000)."""

    input_u: int
    cache_read_u: int
    cache_write_u: int
    output_u: int
    model: str
    tier: str
    price_sheet_version: str

    @property
    def total_u(self) -> int:
        return self.input_u + self.cache_read_u + self.cache_write_u + self.output_u

    def to_api(self) -> dict[str, Any]:
        """The `cost` object every response carries: USD as decimal strings, so clients need no floats."""
        usd = lambda u: f"{Decimal(u) / MICRO:.6f}"  # noqa: E731
        return {"currency": "USD", "total": usd(self.total_u), "input": usd(self.input_u),
                "cache_read": usd(self.cache_read_u), "cache_write": usd(self.cache_write_u),
                "output": usd(self.output_u), "price_sheet_version": self.price_sheet_version}


def micro_usd(tokens: int, rate: Decimal) -> int:
    """Tokens × (USD per 1M tokens) in micro-USD, rounded half up (never banker's rounding)."""
    return int((Decimal(tokens) * rate).to_integral_value(rounding=ROUND_HALF_UP))


def usd_to_micro(usd: str | Decimal | int) -> int:
    """'5.00' -> 5_000_000; rounds half up below one micro-USD."""
    return micro_usd(1, _decimal(usd) * MICRO)


def rates_for(sheet: PriceSheet, model: str, tier: str, input_total: int) -> Rates:
    """Tier prices with the context-length multiplier (the highest threshold the input passes)."""
    r = sheet.rates(model, tier)
    passed = [c for c in sheet.model(model).context_tiers if input_total > c.above_input_tokens]
    if passed:
        r = r.scaled(max(passed, key=lambda c: c.above_input_tokens).multiplier)
    return r


def price(record: UsageRecord, sheet: PriceSheet) -> Cost:
    """Price one usage record; reasoning tokens are part of output and bill as output."""
    r = rates_for(sheet, record.model, record.tier, record.input_total)
    return Cost(
        input_u=micro_usd(record.input_uncached, r.input),
        cache_read_u=micro_usd(record.cache_read, r.cached_input),
        cache_write_u=micro_usd(record.cache_write, r.cache_write),
        output_u=micro_usd(record.output_total, r.output),
        model=record.model,
        tier=record.tier,
        price_sheet_version=sheet.version,
    )


def parse_price_sheet(data: Any, origin: str = "price sheet") -> PriceSheet:
    try:
        return PriceSheet.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(top)'}: {e['msg']}" for e in exc.errors())
        raise PriceError(f"{origin}: {problems}") from None


def load_price_sheet(path: str | Path | None = None) -> PriceSheet:
    """Read a YAML (or JSON) price sheet; None or "" gives the built-in sheet."""
    p = Path(path).expanduser() if path else DEFAULT_SHEET
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise PriceError(f"cannot read price sheet {p}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise PriceError(f"price sheet {p} is not valid YAML: {exc}") from None
    return parse_price_sheet(data, str(p))


# -- LiteLLM (model_prices_and_context_window.json): USD per token, floats --------------------------

_LITELLM_SUFFIX = {"standard": "", "batch": "_batches", "fast": "_priority"}


def _per_token(per_million: Decimal) -> float:
    return float(per_million / MICRO)


def _per_million(per_token: Any) -> Decimal:
    # str() of a float is its shortest round-tripping repr, so 2.5e-06 comes back as exactly 2.5
    return (_decimal(str(per_token)) * MICRO).normalize()


def to_litellm(sheet: PriceSheet, provider: str = "mainspring") -> dict[str, dict[str, Any]]:
    """Export in LiteLLM's field names (context tiers are not exported: LiteLLM's fixed thresholds differ)."""
    out: dict[str, dict[str, Any]] = {}
    for name, m in sheet.models.items():
        entry: dict[str, Any] = {
            "max_input_tokens": m.context_window,
            "max_output_tokens": m.max_output_tokens,
            "max_tokens": m.max_output_tokens,
            "litellm_provider": provider,
            "mode": "chat",
            "supports_prompt_caching": True,
        }
        if m.cache.min_prefix_tokens:
            entry["prompt_cache_min_tokens"] = m.cache.min_prefix_tokens
        for tier in m.tiers:
            r, sfx = sheet.rates(name, tier), _LITELLM_SUFFIX[tier]
            entry[f"input_cost_per_token{sfx}"] = _per_token(r.input)
            entry[f"output_cost_per_token{sfx}"] = _per_token(r.output)
            entry[f"cache_read_input_token_cost{sfx}"] = _per_token(r.cached_input)
            entry[f"cache_creation_input_token_cost{sfx}"] = _per_token(r.cache_write)
        out[name] = entry
    return out


def from_litellm(data: dict[str, Any], version: str, models: list[str] | None = None) -> PriceSheet:
    """Import LiteLLM entries. With `models`, exactly those (missing ones are an error); without,
    every chat/completion entry that has input and output prices (others, e.g. images, are skipped)."""
    names = models if models is not None else [k for k in data if k != "sample_spec"]
    priced: dict[str, Any] = {}
    for name in names:
        e = data.get(name)
        if e is None:
            raise UnknownModel(name, [k for k in data if k != "sample_spec"])
        usable = (isinstance(e, dict) and e.get("mode", "chat") in ("chat", "completion", "responses")
                  and "input_cost_per_token" in e and "output_cost_per_token" in e)
        if not usable:
            if models is not None:
                raise PriceError(f"LiteLLM entry {name!r} has no chat input/output per-token prices")
            continue
        ctx = e.get("max_input_tokens") or e.get("max_tokens")
        max_out = e.get("max_output_tokens") or e.get("max_tokens")
        if not ctx or not max_out:
            if models is not None:
                raise PriceError(f"LiteLLM entry {name!r} has no max_input_tokens / max_output_tokens")
            continue
        tiers: dict[str, Any] = {}
        for tier, sfx in _LITELLM_SUFFIX.items():
            if f"input_cost_per_token{sfx}" not in e or f"output_cost_per_token{sfx}" not in e:
                continue
            inp = _per_million(e[f"input_cost_per_token{sfx}"])
            # no cache-read price means no discount: bill cached tokens as input, never guess a ratio
            cached = e.get(f"cache_read_input_token_cost{sfx}", e.get("cache_read_input_token_cost"))
            write = e.get(f"cache_creation_input_token_cost{sfx}")
            tiers[tier] = {"input": inp, "output": _per_million(e[f"output_cost_per_token{sfx}"]),
                           "cached_input": inp if cached is None else _per_million(cached),
                           **({} if write is None else {"cache_write": _per_million(write)})}
        cache = {"min_prefix_tokens": int(e["prompt_cache_min_tokens"])} if e.get("prompt_cache_min_tokens") else {}
        priced[name] = {"context_window": int(ctx), "max_output_tokens": int(max_out), "tiers": tiers,
                        "cache": cache, "source": f"litellm:{e.get('litellm_provider', 'unknown')}"}
    return parse_price_sheet({"schema": "price-sheet/v1", "version": version, "models": priced}, "LiteLLM import")

"""The engine's measured decode rate (engine/decode_rate.py), as the plan scheduler's admission reads it through
the server's model resolver (api/agent_models.py)."""

from __future__ import annotations

import asyncio

import pytest

from mainspring.engine.decode_rate import DecodeRate


def test_the_rate_is_tokens_over_stepping_time_in_the_window():
    rate = DecodeRate(steps=2)
    assert rate.tokens_per_s() is None  # nothing measured: admission puts no limit
    rate.record(10, 0.5)
    rate.record(30, 1.5)
    assert rate.tokens_per_s() == pytest.approx(20.0)
    rate.record(4, 1.0)  # the first step leaves the window
    assert rate.tokens_per_s() == pytest.approx(34 / 2.5)
    rate.record(5, 0.0)  # a step without time is not a measurement
    assert rate.tokens_per_s() == pytest.approx(34 / 2.5)


@pytest.mark.slow
def test_the_embedded_engine_measures_its_steps_and_the_resolver_reports_them(embedded):
    from mainspring.api.agent_models import AppModels
    from mainspring.api.upstream import Upstreams
    from mainspring.engine.async_engine import AsyncLLMEngine
    from mainspring.engine.config import EngineConfig
    from mainspring.engine.engine import LLMEngine
    from mainspring.engine.params import SamplingParams

    engine = AsyncLLMEngine(LLMEngine(embedded, EngineConfig(kv_cache_mb=64)))
    try:
        models = AppModels(engine, Upstreams(), None, configured_model="smollm2")
        assert models.engine_rate("default") is None  # no step yet
        prompt = engine.tokenizer.encode("Count to ten:")
        out = asyncio.run(engine.generate(prompt, SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)))
        assert len(out.token_ids) == 8
        rate = models.engine_rate("default")
        assert rate is not None and rate > 0
        assert models.engine_rate("smollm2") == models.engine_rate(engine.engine.name)  # aliases: one engine
        assert models.engine_key("default") == models.engine_key("smollm2") == engine.engine.name
        assert models.engine_rate("some-upstream") is None and models.engine_key("some-upstream") == "some-upstream"
    finally:
        engine.close()

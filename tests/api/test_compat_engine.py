"""The engine parts under the compatibility fields: prompt_logprobs over chunked prefill, max_tokens 0,
logit_bias under speculative decoding, and `prepare_schema` (every schema constrained decoding gets)."""

from __future__ import annotations

import pytest

from mainspring.engine.errors import InvalidRequestError
from mainspring.engine.json_schema import prepare_schema
from mainspring.engine.params import SamplingParams

TEXT = "The quick brown fox jumps over the lazy dog. " * 3


@pytest.fixture(scope="module")
def engine(embedded):
    from mainspring.engine.config import EngineConfig
    from mainspring.engine.engine import LLMEngine

    # 16-token chunks: a 31-token prompt is prefilled in two chunks and a 1-token tail
    return LLMEngine(embedded, EngineConfig(kv_cache_mb=64, max_num_batched_tokens=16))


@pytest.mark.slow
def test_prompt_logprobs_match_perplexity_across_chunks(engine):
    from mainspring.engine.perplexity import perplexity

    ids = engine.tokenizer.encode(TEXT)
    engine.generate(ids, SamplingParams(max_tokens=2, temperature=0))  # cached now: must not be skipped
    out = engine.generate(ids, SamplingParams(max_tokens=0, prompt_logprobs=2, temperature=0))[0]
    assert out.token_ids == [] and out.text == "" and out.finish_reason == "length"
    assert out.usage.completion_tokens == 0 and out.usage.cached_tokens == 0
    assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(ids)
    assert [lp.token_id for lp in out.prompt_logprobs[1:]] == ids[1:]
    assert all(len(lp.top) == 2 for lp in out.prompt_logprobs[1:])
    ref = perplexity(engine, ids, chunk=64)  # one forward over the whole text
    assert [-lp.logprob for lp in out.prompt_logprobs[1:]] == pytest.approx(ref.nll, abs=1e-3)


def test_max_tokens_0_needs_prompt_logprobs():
    with pytest.raises(InvalidRequestError, match="max_tokens"):
        SamplingParams(max_tokens=0)
    SamplingParams(max_tokens=0, prompt_logprobs=0)


@pytest.mark.parametrize("bias", [{-1: 1.0}, {3: 101.0}, {3: float("nan")}, {True: 1.0}, [1, 2]])
def test_bad_logit_bias(bias):
    with pytest.raises(InvalidRequestError, match="logit_bias"):
        SamplingParams(logit_bias=bias)


@pytest.mark.slow
def test_logit_bias_out_of_vocab_and_under_speculation(embedded, engine):
    from mainspring.engine.config import EngineConfig
    from mainspring.engine.engine import LLMEngine
    from mainspring.engine.speculative import SpeculativeConfig

    with pytest.raises(InvalidRequestError, match="logit_bias"):
        engine.add_request("hi", SamplingParams(logit_bias={10**7: 1.0}))
    spec = LLMEngine(embedded, EngineConfig(kv_cache_mb=64, speculative=SpeculativeConfig("ngram", k=4, n=2)))
    ids = spec.tokenizer.encode(TEXT)
    plain = spec.generate(ids, SamplingParams(max_tokens=6, temperature=0))[0].token_ids
    banned = spec.generate(ids, SamplingParams(max_tokens=6, temperature=0, logit_bias={t: -100 for t in plain}))
    assert not set(banned[0].token_ids) & set(plain)  # drafts from the prompt are verified with the bias too


def test_prepare_schema_rebases_checks_and_drops_unknown_formats():
    schema = {"$defs": {"A": {"type": "string", "format": "text"}},
              "properties": {"a": {"$ref": "#/$defs/A"}, "me": {"$ref": "#"},
                             "d": {"type": "string", "format": "date", "default": {"$ref": "#/nowhere"}}}}
    out = prepare_schema(schema, at="/properties/arguments")
    assert out["properties"]["a"] == {"$ref": "#/properties/arguments/$defs/A"}
    assert out["properties"]["me"] == {"$ref": "#/properties/arguments"}
    assert out["$defs"]["A"] == {"type": "string"}  # Anthropic's "text" is no format the compiler knows
    assert out["properties"]["d"]["format"] == "date" and out["properties"]["d"]["default"] == {"$ref": "#/nowhere"}
    assert schema["$defs"]["A"]["format"] == "text"  # the client's schema is left alone
    assert prepare_schema(schema)["properties"]["a"] == {"$ref": "#/$defs/A"}
    with pytest.raises(InvalidRequestError, match="only local references"):
        prepare_schema({"properties": {"x": {"$ref": "other.json#/X"}}})
    with pytest.raises(InvalidRequestError, match="points at nothing"):
        prepare_schema({"properties": {"x": {"$ref": "#/$defs/Missing"}}})
    assert prepare_schema({"items": [{"$ref": "#/items/1"}, {"type": "integer"}]})["items"][0] == {"$ref": "#/items/1"}

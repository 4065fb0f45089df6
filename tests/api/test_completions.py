"""/v1/completions through the official `openai` SDK against a real server."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow

PROMPT = "The capital of France is"


def test_plain_completion(oai):
    r = oai.completions.create(model="smollm2", prompt=PROMPT, temperature=0, max_tokens=12)
    assert r.id.startswith("cmpl-") and r.object == "text_completion" and r.model == "SmolLM2-135M-Instruct"
    (c,) = r.choices
    assert c.text and c.finish_reason in ("stop", "length") and c.logprobs is None
    assert r.usage.completion_tokens <= 12 and r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_default_max_tokens_is_16(oai):
    r = oai.completions.create(model="smollm2", prompt="Once upon a time", temperature=0)
    assert r.usage.completion_tokens <= 16


def test_stream_matches_non_stream(oai):
    plain = oai.completions.create(model="smollm2", prompt=PROMPT, temperature=0, max_tokens=12, logprobs=2)
    chunks = list(oai.completions.create(model="smollm2", prompt=PROMPT, temperature=0, max_tokens=12, logprobs=2,
                                         stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == plain.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == plain.choices[0].finish_reason
    tokens = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
    assert tokens == plain.choices[0].logprobs.tokens
    offsets = [o for c in chunks if c.choices and c.choices[0].logprobs for o in c.choices[0].logprobs.text_offset]
    assert offsets == plain.choices[0].logprobs.text_offset
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == plain.usage.completion_tokens


def test_several_prompts_and_token_ids_with_n(oai):
    ids = oai.completions.create(model="smollm2", prompt=PROMPT, temperature=0, max_tokens=6)
    r = oai.completions.create(model="smollm2", prompt=[PROMPT, "One, two, three,"], n=2, temperature=0, max_tokens=6)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    assert r.choices[0].text == r.choices[1].text == ids.choices[0].text  # greedy: both choices of prompt 0 agree
    single = oai.completions.create(model="smollm2", prompt="One, two, three,", temperature=0, max_tokens=6)
    assert r.usage.prompt_tokens == ids.usage.prompt_tokens + single.usage.prompt_tokens  # each prompt once
    tok_ids = [1, 504, 3575, 282, 4649, 314]  # token-id prompts are this model's own ids
    by_ids = oai.completions.create(model="smollm2", prompt=tok_ids, temperature=0, max_tokens=4)
    assert by_ids.usage.prompt_tokens == len(tok_ids)

"""OpenAI sampling compatibility through the official SDK: logit_bias, completions echo with prompt
logprobs (what lm-eval's loglikelihood sends), and logprobs / top_logprobs of 0."""

from __future__ import annotations

import openai
import pytest

from mainspring.engine.params import SamplingParams

pytestmark = pytest.mark.slow

PROMPT = "The capital of France is Paris. The capital of Italy is"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def engine_greedy(server, prompt: str | list[int], n: int = 3) -> list[int]:
    """The engine's own greedy tokens for a prompt, straight from LLMEngine (no HTTP)."""
    import asyncio

    out = asyncio.run(server.engine.generate(prompt, SamplingParams(temperature=0, max_tokens=n)))
    return out.token_ids


# ---- logit_bias -----------------------------------------------------------------------------------
def test_banning_the_greedy_token_changes_the_output(oai, server):
    tok = server.engine.tokenizer
    greedy = engine_greedy(server, tok.encode(PROMPT))
    plain = oai.completions.create(model="smollm2", prompt=PROMPT, temperature=0, max_tokens=3)
    assert plain.choices[0].text == tok.decode(greedy)
    banned = oai.completions.create(model="smollm2", prompt=PROMPT, temperature=0, max_tokens=3, logprobs=0,
                                    logit_bias={str(greedy[0]): -100})
    first = banned.choices[0].logprobs.tokens[0]
    assert first != tok.token_text(greedy[0])
    assert banned.choices[0].logprobs.token_logprobs[0] < 0  # the reported logprob is the model's, unbiased


def test_plus_100_forces_a_token(oai, server):
    tok = server.engine.tokenizer
    (banana,) = tok.encode(" banana")
    r = oai.completions.create(model="smollm2", prompt=PROMPT, temperature=0.8, seed=3, max_tokens=4,
                               logit_bias={str(banana): 100})
    assert r.choices[0].text == " banana" * 4
    c = oai.chat.completions.create(model="smollm2", messages=QUESTION, temperature=0, max_tokens=2,
                                    logit_bias={str(banana): 100})
    assert c.choices[0].message.content == " banana" * 2


def test_chat_ban_by_id(oai, server):
    tok = server.engine.tokenizer
    plain = oai.chat.completions.create(model="smollm2", messages=QUESTION, temperature=0, max_tokens=4, logprobs=True)
    first = plain.choices[0].logprobs.content[0].token
    first_id = next(i for i in tok.encode(plain.choices[0].message.content) if tok.token_text(i) == first)
    banned = oai.chat.completions.create(model="smollm2", messages=QUESTION, temperature=0, max_tokens=4,
                                         logprobs=True, logit_bias={str(first_id): -100})
    assert banned.choices[0].logprobs.content[0].token != first


@pytest.mark.parametrize("bias, words", [({"abc": 1}, "token ids"), ({"99999999": 1}, "vocabulary"),
                                         ({"5": 150}, "between -100 and 100")])
def test_bad_logit_bias_is_a_400(oai, bias, words):
    for call in (lambda: oai.completions.create(model="smollm2", prompt="x", max_tokens=1, logit_bias=bias),
                 lambda: oai.chat.completions.create(model="smollm2", messages=QUESTION, max_tokens=1,
                                                     logit_bias=bias)):
        with pytest.raises(openai.BadRequestError) as e:
            call()
        assert e.value.param == "logit_bias" and words in e.value.message


# ---- echo -----------------------------------------------------------------------------------------
def test_echo_scores_the_prompt_like_the_engine_decodes_it(oai, server):
    tok = server.engine.tokenizer
    ids = tok.encode(PROMPT)
    r = oai.completions.create(model="smollm2", prompt=PROMPT, echo=True, max_tokens=0, logprobs=2)
    c = r.choices[0]
    assert c.text == PROMPT and r.usage.completion_tokens == 0 and r.usage.prompt_tokens == len(ids)
    lp = c.logprobs
    assert lp.tokens == [tok.token_text(i) for i in ids]
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(v <= 0 for v in lp.token_logprobs[1:]) and lp.text_offset[0] == 0
    assert all(tok.token_text(ids[k]) in lp.top_logprobs[k] and len(lp.top_logprobs[k]) <= 3
               for k in range(1, len(ids)))
    # independent check through the decode path: force token k after the prefix ids[:k] and read the
    # logprob the sampler reports for it (raw logits, before the bias)
    for k in (1, len(ids) // 2, len(ids) - 1):
        forced = oai.completions.create(model="smollm2", prompt=ids[:k], max_tokens=1, logprobs=0, temperature=0,
                                        logit_bias={str(ids[k]): 100})
        assert forced.choices[0].logprobs.tokens == [tok.token_text(ids[k])]
        assert forced.choices[0].logprobs.token_logprobs[0] == pytest.approx(lp.token_logprobs[k], abs=2e-3)


def test_echo_with_a_completion_streamed_and_not(oai):
    args = dict(model="smollm2", prompt=PROMPT, echo=True, max_tokens=3, logprobs=1, temperature=0)
    r = oai.completions.create(**args)
    c = r.choices[0]
    plain = oai.completions.create(model="smollm2", prompt=PROMPT, max_tokens=3, temperature=0)
    assert c.text == PROMPT + plain.choices[0].text and c.finish_reason == "length"
    n = r.usage.prompt_tokens
    assert len(c.logprobs.tokens) == n + 3 and c.logprobs.token_logprobs[0] is None
    assert c.logprobs.text_offset == sorted(c.logprobs.text_offset)
    chunks = list(oai.completions.create(**args, stream=True))
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == c.text
    tokens = [t for ch in chunks if ch.choices and ch.choices[0].logprobs for t in ch.choices[0].logprobs.tokens]
    offsets = [o for ch in chunks if ch.choices and ch.choices[0].logprobs for o in ch.choices[0].logprobs.text_offset]
    assert tokens == c.logprobs.tokens and offsets == c.logprobs.text_offset


def test_echo_of_token_prompts_and_several_prompts(oai, server):
    tok = server.engine.tokenizer
    r = oai.completions.create(model="smollm2", prompt=["One, two,", "Red, green,"], echo=True, max_tokens=0)
    assert [c.text for c in r.choices] == ["One, two,", "Red, green,"] and r.usage.completion_tokens == 0
    ids = tok.encode("One, two,")
    r = oai.completions.create(model="smollm2", prompt=ids, echo=True, max_tokens=2, temperature=0)
    assert r.choices[0].text.startswith("One, two,")


def test_max_tokens_0_without_echo_is_empty(oai):
    r = oai.completions.create(model="smollm2", prompt=PROMPT, max_tokens=0)
    assert r.choices[0].text == "" and r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 0


# ---- logprobs 0 -----------------------------------------------------------------------------------
def test_completions_logprobs_0_reports_the_sampled_token(oai):
    r = oai.completions.create(model="smollm2", prompt=PROMPT, max_tokens=4, logprobs=0, temperature=0)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == 4
    assert lp.top_logprobs == [{t: v} for t, v in zip(lp.tokens, lp.token_logprobs)]
    r = oai.completions.create(model="smollm2", prompt=PROMPT, max_tokens=4, logprobs=2, temperature=0.9, seed=1)
    for t, v, top in zip(r.choices[0].logprobs.tokens, r.choices[0].logprobs.token_logprobs,
                         r.choices[0].logprobs.top_logprobs):
        assert top[t] == v and len(top) in (2, 3)  # the 2 likeliest, and the sampled one if it is not


def test_chat_top_logprobs_0(oai):
    r = oai.chat.completions.create(model="smollm2", messages=QUESTION, max_tokens=4, logprobs=True, top_logprobs=0,
                                    temperature=0)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    assert all(t.top_logprobs == [] and t.logprob <= 0 and t.token for t in content)
    assert "".join(t.token for t in content) == r.choices[0].message.content

"""LLMEngine end to end on the embedded model: batching, prefix cache, preemption, seeds, errors."""

import asyncio

import pytest
import torch

from mainspring.engine.async_engine import AsyncLLMEngine
from mainspring.engine.config import EngineConfig
from mainspring.engine.engine import LLMEngine
from mainspring.engine.errors import InvalidRequestError
from mainspring.engine.params import SamplingParams

pytestmark = pytest.mark.slow

QUESTIONS = [
    "What is the capital of France?", "Write a haiku about the sea.", "List three prime numbers.",
    "Explain what a CPU does.", "How do plants make food?", "Say hello in Spanish.",
    "What is 12 plus 30?", "Name a famous painter.", "Why is the sky blue?", "Describe a cat.",
    "What is Python?", "Give me a synonym for happy.", "What does DNA stand for?",
    "How many days are in a week?", "What is the opposite of cold?", "Tell me a fun fact.",
    "What color is grass?",
]
GREEDY = SamplingParams(temperature=0.0, max_tokens=24)


def chat(engine, q: str, system: str | None = None) -> list[int]:
    msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": q}]
    return engine.tokenizer.encode(engine.tokenizer.apply_chat_template(msgs))


@pytest.fixture(scope="module")
def engine(embedded):
    return LLMEngine(embedded, EngineConfig(kv_cache_mb=256, max_num_batched_tokens=256))


def test_answers_a_question(engine):
    out = engine.generate([chat(engine, "What is the capital of France?")], GREEDY)[0]
    assert "Paris" in out.text
    assert out.finish_reason in ("stop", "length")
    assert out.usage.prompt_tokens == len(out.prompt_token_ids) and out.usage.completion_tokens == len(out.token_ids)


def test_greedy_is_identical_alone_batched_cached_and_preempted(embedded, engine):
    prompts = [chat(engine, q) for q in QUESTIONS]
    alone = [engine.generate([p], GREEDY)[0].token_ids for p in prompts[:3]]
    fresh = LLMEngine(embedded, EngineConfig(kv_cache_mb=256, max_num_batched_tokens=256))
    batched = fresh.generate(prompts, GREEDY)  # 17 at once, chunked prefill mixing with decodes
    assert [o.token_ids for o in batched[:3]] == alone
    again = fresh.generate(prompts[:3], GREEDY)  # now served from the prefix cache
    assert all(o.usage.cached_tokens > 0 for o in again)
    assert [o.token_ids for o in again] == alone
    # a pool too small for all 17: sequences get preempted and recomputed
    tiny = LLMEngine(embedded, EngineConfig(num_blocks=24, block_size=16, max_num_batched_tokens=128))
    squeezed = tiny.generate(prompts, GREEDY)
    assert tiny.scheduler.num_preemptions > 0
    assert [o.token_ids for o in squeezed] == [o.token_ids for o in batched]


def test_prefix_cache_reports_cached_tokens(engine):
    system = "You are a careful assistant. " * 20
    a = engine.generate([chat(engine, "Name a colour.", system)], GREEDY)[0]
    b = engine.generate([chat(engine, "Name an animal.", system)], GREEDY)[0]
    bs = engine.config.block_size
    assert b.usage.cached_tokens >= (len(engine.tokenizer.encode(system)) // bs - 1) * bs
    assert b.usage.cached_tokens % bs == 0 and b.usage.cached_tokens < b.usage.prompt_tokens
    assert a.usage.prompt_tokens > 0


def test_same_seed_same_text(engine):
    p = chat(engine, "Write a sentence about trains.")
    params = SamplingParams(temperature=1.0, top_p=0.95, max_tokens=20, seed=1234)
    first = engine.generate([p], params)[0].text
    others = [SamplingParams(temperature=1.0, max_tokens=20) for _ in range(3)]
    batch = engine.generate([p, p, p, p], [params] + others)
    assert batch[0].text == first
    texts = {engine.generate([p], SamplingParams(temperature=1.0, max_tokens=20, seed=s))[0].text for s in range(4)}
    assert len(texts) > 1  # different seeds explore different continuations


def test_stop_strings_and_logprobs(engine):
    p = chat(engine, "Count from 1 to 10, separated by commas.")
    out = engine.generate([p], SamplingParams(temperature=0.0, max_tokens=40, stop=["5"], logprobs=3))[0]
    assert out.finish_reason == "stop" and out.stop_reason == "5"
    assert "5" not in out.text and "4" in out.text
    assert len(out.logprobs) == len(out.token_ids)
    first = out.logprobs[0]
    assert first.logprob <= 0 and len(first.top) == 3 and first.top[0].logprob >= first.top[-1].logprob
    assert first.token_id == first.top[0].token_id  # greedy picks the most likely token


def test_max_tokens_and_abort(engine):
    rid = engine.add_request(chat(engine, "Tell me a long story."), SamplingParams(temperature=0.0, max_tokens=500))
    engine.step()
    out = engine.abort(rid)
    assert out.finished and out.finish_reason == "abort"
    assert not engine.has_unfinished()
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    done = engine.generate(["Once upon a time"], SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True))[0]
    assert done.finish_reason == "length" and len(done.token_ids) == 5


def test_bad_input_is_a_clear_error(engine):
    with pytest.raises(InvalidRequestError, match="context"):
        engine.add_request([1] * (engine.max_model_len + 5), GREEDY)
    with pytest.raises(InvalidRequestError, match="empty"):
        engine.add_request("", GREEDY)
    with pytest.raises(InvalidRequestError, match="top_p"):
        SamplingParams(top_p=1.5)
    assert not engine.has_unfinished()


def test_async_stream_yields_deltas_and_aborts(engine):
    aeng = AsyncLLMEngine(engine)

    async def go():
        deltas, last = [], None
        async for out in aeng.stream(chat(engine, "What is 2+2?"), GREEDY):
            deltas.append(out.delta_text)
            last = out
        assert last.finished and "".join(deltas) == last.text
        agen = aeng.stream(chat(engine, "Tell me a long story."), SamplingParams(temperature=0, max_tokens=300))
        async for _ in agen:
            break
        await agen.aclose()  # leaving early aborts the request
        for _ in range(50):
            if not engine.has_unfinished():
                break
            await asyncio.sleep(0.05)
        assert not engine.has_unfinished()

    try:
        asyncio.run(go())
    finally:
        aeng.close()


def test_logits_match_transformers_on_embedded_model(embedded):
    transformers = pytest.importorskip("transformers")
    from mainspring.engine.attention import AttentionMetadata
    from mainspring.engine.model import CausalLM

    hf = transformers.AutoModelForCausalLM.from_pretrained(embedded.path, torch_dtype=torch.float32).eval()
    ours = CausalLM(embedded.config)
    ours.load_weights(embedded.state_dict)
    ids = embedded.tokenizer.encode("The quick brown fox jumps over the lazy dog because")
    c = embedded.config
    cache = [(torch.zeros(64, c.num_key_value_heads, c.head_dim), torch.zeros(64, c.num_key_value_heads, c.head_dim))
             for _ in range(c.num_hidden_layers)]
    meta = AttentionMetadata.build([], [([0, 1, 2, 3], 0, len(ids))], 16)
    with torch.no_grad():
        got = ours.compute_logits(ours(torch.tensor(ids), torch.arange(len(ids)), cache, meta))
        want = hf(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(got, want, atol=2e-4, rtol=1e-4)

"""KV policies in the engine: sinks + sliding window and the cold tier, on real and tiny models."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mainspring.engine.config import EngineConfig, ModelConfig
from mainspring.engine.engine import LLMEngine
from mainspring.engine.errors import InvalidRequestError
from mainspring.engine.kv_policy import KVPolicy, KVPolicyConfig
from mainspring.engine.loader import LoadedModel
from mainspring.engine.params import SamplingParams
from mainspring.engine.perplexity import perplexity

pytestmark = pytest.mark.slow  # the embedded model

LICENSE = Path("/usr/share/common-licenses/GPL-3")  # Debian's base-files: English prose on every host


@pytest.fixture(scope="module")
def engine(embedded):
    return LLMEngine(embedded, EngineConfig(kv_cache_mb=192))


def text_ids(embedded, n: int) -> list[int]:
    ids = embedded.tokenizer.encode(LICENSE.read_text())
    assert len(ids) >= n
    return ids[:n]


def hot_blocks(seq) -> int:
    return sum(1 for b in seq.block_table if b >= 0)


def test_a_window_wider_than_the_sequence_is_dense_attention(engine):
    prompts = ["The capital of France is", "List three colours of the rainbow:"]
    dense = engine.generate(prompts, SamplingParams(temperature=0, max_tokens=24))
    wide = engine.generate(prompts, SamplingParams(temperature=0, max_tokens=24, attention_window=4096))
    assert [o.token_ids for o in wide] == [o.token_ids for o in dense]


def test_sinks_keep_a_windowed_model_stable_where_a_plain_window_is_not(engine, embedded):
    """StreamingLLM's finding on our model: once the window has slid past the first tokens,
    dropping them (window only) wrecks perplexity; keeping 4 sinks stays close to dense."""
    ids = text_ids(embedded, 640)
    dense = perplexity(engine, ids).ppl(128)
    sinks = perplexity(engine, ids, KVPolicy(window=64, sink_tokens=4), chunk=128)
    window = perplexity(engine, ids, KVPolicy(window=64, sink_tokens=0), chunk=128)
    assert sinks.ppl(128) < 0.7 * window.ppl(128)  # measured 26 vs 57
    assert sinks.ppl(128) < 1.6 * dense  # measured 26 vs 19
    # bounded: sink block + window + one chunk, not the 40 blocks of the text
    assert sinks.peak_hot_blocks <= KVPolicy(window=64).max_blocks(16, 128)


def test_windowed_generation_holds_a_bounded_number_of_blocks(engine):
    params = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True, attention_window=48)
    rid = engine.add_request("Once upon a time", params)
    seq = engine._requests[rid].seq
    peak, done = 0, None
    while engine.has_unfinished():
        for out in engine.step():
            done = out if out.finished else done
        if seq.block_table:
            peak = max(peak, hot_blocks(seq))
    assert done.finish_reason == "length" and len(done.token_ids) == 200
    assert peak <= 1 + -(-48 // 16) + 2  # sinks' block + window + the block being written
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_windowed_blocks_never_serve_a_dense_request(engine):
    prompt = "A long shared system prompt about gardening. " * 12
    engine.generate(prompt, SamplingParams(temperature=0, max_tokens=2, attention_window=64))
    dense = engine.generate(prompt, SamplingParams(temperature=0, max_tokens=2))[0]
    again = engine.generate(prompt, SamplingParams(temperature=0, max_tokens=2, attention_window=64))[0]
    assert dense.usage.cached_tokens == 0  # the windowed run's blocks carry their own salt
    assert again.usage.cached_tokens > 0  # but serve the next request under the same policy


def test_bad_policies_are_clear_errors(engine):
    with pytest.raises(InvalidRequestError, match="attention_window must be at least 32"):
        engine.add_request("hi", SamplingParams(attention_window=8))
    with pytest.raises(InvalidRequestError, match="cold KV tier"):
        engine.add_request("hi", SamplingParams(kv_hot_tokens=64))
    with pytest.raises(InvalidRequestError, match="attention_window must be at most 2147483647 tokens"):
        engine.add_request("hi", SamplingParams(attention_window=10**31))  # past int64: it once failed the step
    with pytest.raises(InvalidRequestError, match="non-negative"):
        SamplingParams(attention_window=-1)
    with pytest.raises(ValueError, match="unknown kv policy"):
        KVPolicyConfig.parse("windw=4")
    with pytest.raises(ValueError, match="bits must be 8 or 4"):
        KVPolicyConfig.parse("hot=256,bits=2")
    assert KVPolicyConfig.parse("window=1024,sinks=4") == KVPolicyConfig(KVPolicy(window=1024, sink_tokens=4))
    assert KVPolicyConfig.parse("hot=256").cold_bits == 8  # a hot span needs a cold tier: int8 unless told
    assert KVPolicyConfig.parse('{"bits": 4}') == KVPolicyConfig(cold_bits=4)
    assert KVPolicyConfig.parse("dense") is None


def tiny_model(embedded, context: int) -> LoadedModel:
    """A 2-layer Llama with random weights, the embedded tokenizer and a `context`-token window."""
    vocab, hidden, inter, layers, heads, kvh = embedded.config.vocab_size, 64, 128, 2, 4, 2
    d = hidden // heads
    g = torch.Generator().manual_seed(0)

    def w(*shape):
        return torch.randn(*shape, generator=g) * 0.1

    sd = {"model.embed_tokens.weight": w(vocab, hidden), "model.norm.weight": torch.ones(hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        sd.update({p + "self_attn.q_proj.weight": w(heads * d, hidden),
                   p + "self_attn.k_proj.weight": w(kvh * d, hidden),
                   p + "self_attn.v_proj.weight": w(kvh * d, hidden),
                   p + "self_attn.o_proj.weight": w(hidden, heads * d),
                   p + "mlp.gate_proj.weight": w(inter, hidden), p + "mlp.up_proj.weight": w(inter, hidden),
                   p + "mlp.down_proj.weight": w(hidden, inter), p + "input_layernorm.weight": torch.ones(hidden),
                   p + "post_attention_layernorm.weight": torch.ones(hidden)})
    cfg = ModelConfig("llama", vocab, hidden, inter, layers, heads, kvh, d, context, tie_word_embeddings=True)
    return LoadedModel("tiny", embedded.path, cfg, sd, embedded.tokenizer)


def test_sinks_and_window_decode_to_four_times_the_trained_context(embedded):
    context = 128
    # 64-token chunks: a long prompt is prefilled in pieces, each reading only its window
    eng = LLMEngine(tiny_model(embedded, context), EngineConfig(kv_cache_mb=8, max_num_batched_tokens=64))
    prompt = list(range(100, 140))
    with pytest.raises(InvalidRequestError, match="context"):  # dense: the context is the limit
        eng.add_request(list(range(100, 100 + context)), SamplingParams(max_tokens=4))
    n = 4 * context + 20
    params = SamplingParams(temperature=0.8, seed=1, max_tokens=n, ignore_eos=True, attention_window=64,
                            logprobs=0)
    rid = eng.add_request(prompt, params)
    seq, peak, out = eng._requests[rid].seq, 0, None
    while eng.has_unfinished():
        for o in eng.step():
            out = o if o.finished else out
        if seq.block_table:
            peak = max(peak, hot_blocks(seq))
    assert out.finish_reason == "length" and len(out.token_ids) == n
    assert len(prompt) + n > 4 * context
    assert all(torch.isfinite(torch.tensor(lp.logprob)) for lp in out.logprobs)
    assert peak <= 1 + 64 // 16 + 2
    # a long prompt past the context is prefilled block-sparse, chunk by chunk, in bounded memory
    long_prompt = [100 + (i * 7) % 900 for i in range(3 * context)]
    rid = eng.add_request(long_prompt, SamplingParams(temperature=0, max_tokens=8, attention_window=64))
    seq, peak = eng._requests[rid].seq, 0
    while eng.has_unfinished():
        for o in eng.step():
            out = o if o.finished else out
        if seq.block_table:
            peak = max(peak, hot_blocks(seq))
    assert len(out.token_ids) == 8
    assert peak <= 1 + (64 + 64) // 16 + 1  # sinks' block + window + one chunk, of 24 blocks in the prompt


@pytest.mark.parametrize("bits,max_change", [(8, 0.005), (4, 0.03)])
def test_cold_tier_keeps_perplexity_and_cuts_kv_memory(embedded, bits, max_change):
    """Older blocks quantized (KIVI layout), the last 128 tokens fp32: the targets of the issue
    (int8 <= 0.5%, int4 <= 3% perplexity increase) on 1,024 tokens, with a fraction of the KV."""
    ids = text_ids(embedded, 1024)
    eng = LLMEngine(embedded, EngineConfig(kv_cache_mb=96, kv_policy=KVPolicyConfig(cold_bits=bits)))
    dense = perplexity(eng, ids)
    cold = perplexity(eng, ids, KVPolicy(hot_tokens=128), chunk=32)
    assert abs(cold.ppl() / dense.ppl() - 1) <= max_change
    assert cold.nll != dense.nll  # the cold tier really was read
    assert cold.peak_cold_blocks >= 1024 // 16 - 128 // 16 - 2
    assert cold.kv_bytes_end < dense.kv_bytes_end / (2.4 if bits == 8 else 3.0)


def test_generation_with_a_cold_tier_frees_both_tiers(embedded):
    eng = LLMEngine(embedded, EngineConfig(kv_cache_mb=96, kv_policy=KVPolicyConfig(cold_bits=8)))
    store = eng.runner.cold_store
    prompt = LICENSE.read_text()[:2500]
    params = SamplingParams(temperature=0, max_tokens=40, kv_hot_tokens=64)
    rid = eng.add_request(prompt, params)
    seq, most_cold, out = eng._requests[rid].seq, 0, None
    while eng.has_unfinished():
        for o in eng.step():
            out = o if o.finished else out
        most_cold = max(most_cold, len(seq.cold_blocks))
    assert len(out.token_ids) == 40 and most_cold > 10
    assert store.num_free_blocks == store.num_blocks
    assert eng.block_manager.num_free_blocks == eng.block_manager.num_blocks
    plain = eng.generate(prompt, SamplingParams(temperature=0, max_tokens=40))[0]
    # int8 keys and values barely move the logits: the greedy text starts the same
    assert out.token_ids[:10] == plain.token_ids[:10]


def test_kv_policies_over_a_bf16_cache_score_as_they_do_in_fp32(embedded):
    """A bf16 engine's window + sinks, cold tier and windowed decode: the sparse attention reads the bf16 cache
    (and the cold tier's fp32 blocks) in fp32, so each policy's perplexity stays within bf16 rounding of the
    same policy's in fp32 (512 tokens: fp32 dense 18.83, cold 18.83, window 20.42; bf16 18.82, 18.79, 20.57)."""
    ids = text_ids(embedded, 512)
    scores = {}
    for dtype in ("fp32", "bf16"):
        eng = LLMEngine(embedded, EngineConfig(kv_cache_mb=96, dtype=dtype, kv_policy=KVPolicyConfig(cold_bits=8)))
        cold = perplexity(eng, ids, KVPolicy(hot_tokens=128), chunk=32)
        assert cold.peak_cold_blocks >= 512 // 16 - 128 // 16 - 2  # the cold tier really held the older blocks
        window = perplexity(eng, ids, KVPolicy(window=128), chunk=32)
        scores[dtype] = [perplexity(eng, ids).ppl(), cold.ppl(), window.ppl()]
    assert eng.runner.cache.dtype == torch.bfloat16
    for fp32, bf16 in zip(scores["fp32"], scores["bf16"]):
        assert abs(bf16 / fp32 - 1) <= 0.03, scores
    assert scores["bf16"][2] > 1.04 * scores["bf16"][0]  # the window really dropped context
    params = SamplingParams(temperature=0, max_tokens=120, ignore_eos=True, attention_window=48)
    rid = eng.add_request("Once upon a time", params)
    seq, peak, done = eng._requests[rid].seq, 0, None
    while eng.has_unfinished():
        for out in eng.step():
            done = out if out.finished else done
        peak = max(peak, hot_blocks(seq)) if seq.block_table else peak
    assert len(done.token_ids) == 120 and peak <= 1 + -(-48 // 16) + 2
    assert eng.block_manager.num_free_blocks == eng.block_manager.num_blocks


def test_snapkv_keeps_the_block_a_question_needs(engine, embedded):
    """A needle in 600 tokens of license text, asked for at the end. With 128 tokens of KV kept,
    SnapKV's vote keeps the needle's block and the model still answers; a window of the same size
    has lost it."""
    tok = embedded.tokenizer
    filler = tok.decode(text_ids(embedded, 600))
    cut = filler.find("\n\n", len(filler) // 3)
    prompt = (filler[:cut] + "\n\nNote: the secret launch code is 7351.\n\n" + filler[cut:]
              + "\n\nQuestion: What is the secret launch code?\nAnswer: The secret launch code is")
    answers = {}
    for name, extra in (("dense", {}), ("snap", {"kv_snap_tokens": 128}), ("window", {"attention_window": 128})):
        rid = engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=6, **extra))
        seq, held = engine._requests[rid].seq, 0
        while engine.has_unfinished():
            for o in engine.step():
                answers[name] = o.text if o.finished else answers.get(name)
            if seq.block_table:
                held = sum(1 for b in seq.block_table if b >= 0)
        if name != "dense":
            assert held <= 128 // 16 + 2  # the budget, plus the block decode is writing into
    assert answers["dense"].startswith(" 7351")  # digits are single tokens: 4 of the 6
    assert answers["snap"].startswith(" 7351")
    assert "7351" not in answers["window"]


def test_mixed_policies_in_one_batch_finish_and_free_every_tier(embedded):
    """Window + cold tier, SnapKV + cold tier, SnapKV sampled and dense, batched in one engine with
    small chunks: all finish, and both the hot pool and the cold store are whole afterwards."""
    eng = LLMEngine(tiny_model(embedded, 512), EngineConfig(kv_cache_mb=8, kv_policy=KVPolicyConfig(cold_bits=4),
                                                            max_num_batched_tokens=64))
    prompt = [100 + (i * 13) % 700 for i in range(300)]
    params = [SamplingParams(temperature=0, max_tokens=80, ignore_eos=True, attention_window=96, kv_hot_tokens=48),
              SamplingParams(temperature=0, max_tokens=80, ignore_eos=True, kv_snap_tokens=160, kv_hot_tokens=64),
              SamplingParams(temperature=0.7, seed=3, max_tokens=80, ignore_eos=True, kv_snap_tokens=160),
              SamplingParams(temperature=0, max_tokens=80, ignore_eos=True)]
    outs = eng.generate([prompt] * 4, params)
    assert [len(o.token_ids) for o in outs] == [80] * 4
    assert eng.block_manager.num_free_blocks == eng.block_manager.num_blocks
    assert eng.runner.cold_store.num_free_blocks == eng.runner.cold_store.num_blocks
    stats = eng.stats()
    assert stats["kv_cold_bits"] == 4 and stats["kv_cold_free_blocks"] == stats["kv_cold_blocks"] > 0

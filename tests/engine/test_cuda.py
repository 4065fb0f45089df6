"""The engine on CUDA, on the GPU torch sees (under MAINSPRING_TEST_GPU=1; tests/conftest.py hides it otherwise) or
else on the simulated one (tests/simulated_cuda/: CUDA's rules
enforced, the CPU's kernels computing): weights, paged KV and the step's index tensors on the device, in bf16;
its logits against transformers on the same device and the same weights, greedy decoding that gives the same
tokens alone and in a batch, one host wait per step, CUDA graphs, speculative decoding, and int4 layers on
torch's CUDA kernel (the -fast variant there).

The model is the configured one (MAINSPRING_MODEL: the embedded model, or a Hugging Face folder; the GPU script
bench/gpu_check.sh points it at a folder of random weights in the embedded model's shape, as nothing can be
downloaded there)."""

from __future__ import annotations

import dataclasses

import pytest
import torch



@pytest.fixture(scope="module", autouse=True)
def gpu():
    """The GPU torch sees, or else the simulated one (tests/simulated_cuda/): each op checked for its device,
    its CUDA kernel and the host round trips it makes, then run on the CPU's kernels."""
    if torch.cuda.is_available():
        yield None
        return
    from tests.simulated_cuda import SimulatedCuda

    with SimulatedCuda() as sim:
        yield sim

PROMPTS = ["The quick brown fox jumps over the lazy dog because", "Write a haiku about the sea.",
           "1, 2, 3, 4, 5,", "Paged attention stores the KV cache in blocks so that"]


@pytest.fixture(scope="module")
def loaded():
    from mainspring.config import Settings
    from mainspring.engine.loader import load_model

    s = Settings()
    return load_model(s.model, s.cache_dir)


@pytest.fixture(scope="module")
def engine(loaded):
    from mainspring.engine.config import EngineConfig
    from mainspring.engine.engine import LLMEngine

    return LLMEngine(loaded, EngineConfig(device="cuda", dtype="bf16", kv_cache_mb=512, max_num_batched_tokens=512))


def test_the_weights_and_the_kv_cache_live_on_the_gpu_in_bf16(engine):
    assert engine.placement.device.type == "cuda" and engine.placement.dtype == torch.bfloat16
    assert engine.model.embed_tokens.weight.is_cuda and engine.model.embed_tokens.weight.dtype == torch.bfloat16
    assert engine.runner.cache.is_cuda and engine.runner.cache.dtype == torch.bfloat16
    assert engine.stats()["device"].startswith("cuda")


def test_logits_match_transformers_on_the_same_gpu_within_bf16_tolerance(engine, loaded):
    """Our bf16 logits are as close to transformers' fp32 logits (on the same device, the same weights) as
    transformers' own bf16 logits are: the error bf16 itself makes, whatever the kernels."""
    transformers = pytest.importorskip("transformers")
    from mainspring.engine.attention import AttentionMetadata

    ids = loaded.tokenizer.encode(PROMPTS[0])
    with torch.no_grad():
        want, theirs = (transformers.AutoModelForCausalLM.from_pretrained(loaded.path, dtype=dtype).eval().cuda()(
            torch.tensor([ids], device="cuda")).logits[0].float() for dtype in (torch.float32, torch.bfloat16))
    c = loaded.config
    cache = [(torch.zeros(64, c.num_key_value_heads, c.head_dim, dtype=torch.bfloat16, device="cuda"),
              torch.zeros(64, c.num_key_value_heads, c.head_dim, dtype=torch.bfloat16, device="cuda"))
             for _ in range(c.num_hidden_layers)]
    meta = AttentionMetadata.build([], [([0, 1, 2, 3], 0, len(ids))], 16).to(torch.device("cuda"))
    with torch.no_grad():
        got = engine.model.compute_logits(engine.model(torch.tensor(ids, device="cuda"),
                                                       torch.arange(len(ids), device="cuda"), cache, meta))
    def error(x: torch.Tensor) -> float:
        return ((x - want).norm() / want.norm()).item()

    assert error(got) <= 1.5 * error(theirs) + 1e-3, (error(got), error(theirs))
    top2 = want.topk(2).values
    clear = (top2[:, 0] - top2[:, 1]) > 0.05 * want.abs().max()
    assert torch.equal(got.argmax(-1)[clear], want.argmax(-1)[clear])


def test_greedy_tokens_are_the_same_alone_and_in_a_batch(engine, gpu):
    """On a GPU: token for token. On the simulated one the kernels are the CPU's, whose bf16 GEMMs round a batch
    and a single row differently, so there every batched token must be the lone engine's greedy pick for its
    prefix up to bf16 rounding (a wrong slot, mask or row order misses it by nats)."""
    from mainspring.engine.params import SamplingParams
    from tests.engine.test_speculative import greedy_gaps

    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    prompts = [engine.tokenizer.encode(p) for p in PROMPTS]
    alone = [engine.generate([p], params)[0].token_ids for p in prompts]
    together = [o.token_ids for o in engine.generate(prompts, params)]
    assert all(len(t) == 24 for t in alone + together)
    if gpu is None:
        assert together == alone
    for prompt, tokens in zip(prompts, together):
        assert max(greedy_gaps(engine, prompt, tokens)) <= 0.5, tokens


@pytest.mark.parametrize("graphs", ["capture", "off"])
def test_a_decode_step_waits_for_the_gpu_once_for_its_tokens(engine, loaded, graphs):
    """The only host round trip of a decode step is reading its sampled tokens back (with the logprobs asked
    for, in the same wait): every upload is non-blocking, and top-p / top-k, seeded sampling and penalties make
    no data-dependent read. torch's sync debug mode warns at each synchronizing call (on a GPU, and on the
    simulated one); with graphs captured and without."""
    import warnings

    from mainspring.engine.config import EngineConfig
    from mainspring.engine.engine import LLMEngine
    from mainspring.engine.params import SamplingParams

    if graphs == "off":
        engine = LLMEngine(loaded, EngineConfig(device="cuda", dtype="bf16", kv_cache_mb=128,
                                                max_num_batched_tokens=512, decode_graphs="off"))
    kinds = [SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True),
             SamplingParams(temperature=0.8, top_p=0.9, top_k=40, seed=3, max_tokens=16, ignore_eos=True),
             SamplingParams(temperature=0.7, min_p=0.05, max_tokens=16, ignore_eos=True, logprobs=2,
                            repetition_penalty=1.2, presence_penalty=0.3)]
    for prompt, params in zip(PROMPTS, kinds):
        engine.add_request(engine.tokenizer.encode(prompt), params)
    engine.step()  # the prefills
    steps = 6
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            outputs = [engine.step() for _ in range(steps)]
        finally:
            torch.cuda.set_sync_debug_mode(0)
    waits = [str(w.message) for w in caught if "synchronizing" in str(w.message)]
    assert len(waits) == steps, waits
    assert all(len(out) == 3 for out in outputs)
    assert outputs[-1][2].logprobs and len(outputs[-1][2].logprobs[-1].top) == 2
    while engine.has_unfinished():
        engine.step()


def test_a_greedy_draft_step_waits_for_the_gpu_once_to_draft_and_once_to_verify(loaded):
    """Layer-skip drafting of greedy requests keeps each drafted token on the device for the next draft position
    and reads the whole draft back once; the verify step reads its picks once."""
    import warnings

    from mainspring.engine.config import EngineConfig
    from mainspring.engine.engine import LLMEngine
    from mainspring.engine.params import SamplingParams
    from mainspring.engine.speculative import SpeculativeConfig

    engine = LLMEngine(loaded, EngineConfig(device="cuda", dtype="bf16", kv_cache_mb=128, max_num_batched_tokens=512,
                                            speculative=SpeculativeConfig("draft", k=3)))
    for prompt in PROMPTS[:3]:
        engine.add_request(engine.tokenizer.encode(prompt), SamplingParams(temperature=0, max_tokens=40,
                                                                           ignore_eos=True))
    engine.step()
    steps, drafted = 4, []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            for _ in range(steps):
                before = engine.spec.num_draft_tokens
                engine.step()
                drafted.append(engine.spec.num_draft_tokens - before)
        finally:
            torch.cuda.set_sync_debug_mode(0)
    assert min(drafted) >= 3, drafted  # every step drafted (and verified)
    assert len([w for w in caught if "synchronizing" in str(w.message)]) == 2 * steps


def test_truncation_on_the_gpu_keeps_the_tokens_the_cpu_keeps():
    """Off the CPU, top-p takes every token as a candidate (one sort, no read of the device) where the CPU looks at
    its likeliest few hundred and buckets the flat rows: the same tokens survive, in peaked and flat rows, with
    top-k and min-p on top, and in a batch where some rows ask for no top-p."""
    from mainspring.engine.params import SamplingParams
    from mainspring.engine.truncation import apply_filters

    g = torch.Generator().manual_seed(0)
    spread = torch.tensor([0.05, 0.5, 1.0, 2.0, 4.0, 8.0, 0.2, 1.5]).unsqueeze(1)  # flat rows first
    x = torch.randn(8, 49152, generator=g) * spread
    params = [SamplingParams(top_p=0.9), SamplingParams(top_p=0.5, top_k=50), SamplingParams(top_p=0.99),
              SamplingParams(top_k=20), SamplingParams(top_p=0.95, min_p=0.05), SamplingParams(top_p=0.3),
              SamplingParams(top_p=0.8, top_k=3000), SamplingParams()]
    for rows in (slice(None), slice(0, 3)):  # some rows without top-p, then all rows with it
        on_cpu, on_gpu = x[rows].clone(), x[rows].to("cuda")
        apply_filters(on_cpu, params[rows])
        apply_filters(on_gpu, params[rows])
        kept_cpu, kept_gpu = on_cpu.isfinite(), on_gpu.isfinite().cpu()
        assert torch.equal(kept_gpu, kept_cpu), (kept_gpu.sum(-1), kept_cpu.sum(-1))
        assert kept_cpu.sum(-1).min() >= 1 and kept_cpu[0].sum() > 256  # a flat row: the CPU's histogram path


def test_a_cached_prefix_decodes_the_same_tokens(engine):
    from mainspring.engine.params import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    system = engine.tokenizer.encode("You are a careful assistant. " * 20)
    first = engine.generate([system + engine.tokenizer.encode(" Say hi.")], params)[0]
    again = engine.generate([system + engine.tokenizer.encode(" Say hi.")], params)[0]
    assert again.usage.cached_tokens > 0 and again.token_ids == first.token_ids


def test_sampling_and_a_grammar_run_on_the_gpus_logits(engine):
    pytest.importorskip("llguidance")
    import json

    from mainspring.engine.params import SamplingParams

    schema = {"type": "object", "properties": {"n": {"enum": [1, 2, 3]}}, "required": ["n"],
              "additionalProperties": False}  # a finite language: the grammar ends the answer, whatever the weights
    out = engine.generate([engine.tokenizer.encode("A JSON object:")],
                          SamplingParams(temperature=0.8, seed=1, max_tokens=32, guided_json=schema))[0]
    assert json.loads(out.text)["n"] in (1, 2, 3)


def test_captured_decode_graphs_give_the_eager_tokens(engine, loaded, gpu):
    from mainspring.engine.config import EngineConfig
    from mainspring.engine.engine import LLMEngine
    from mainspring.engine.params import SamplingParams
    from tests.engine.test_speculative import greedy_gaps

    assert engine.runner.graphs is not None and engine.runner.graphs.mode == "capture"  # on by default on CUDA
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    prompts = [engine.tokenizer.encode(p) for p in PROMPTS[:3]]  # 3 rows: a padded bucket of 4
    before = engine.runner.graphs.replays
    graphed = [o.token_ids for o in engine.generate(prompts, params)]
    assert engine.runner.graphs.replays - before >= 20 and (4, 256) in engine.runner.graphs.graphs
    eager_engine = LLMEngine(loaded, EngineConfig(device="cuda", dtype="bf16", kv_cache_mb=256,
                                                  max_num_batched_tokens=512, decode_graphs="off"))
    eager = [o.token_ids for o in eager_engine.generate(prompts, params)]
    # bf16 on different kernels (SDPA over padded tables vs the cascade path): the same greedy tokens, except
    # where a near tie flips one; every graphed token is the eager engine's pick up to bf16 rounding
    assert sum(g == e for g, e in zip(graphed, eager)) >= (2 if gpu is None else 1), (graphed, eager)
    for prompt, tokens in zip(prompts, graphed):
        assert max(greedy_gaps(eager_engine, prompt, tokens)) <= 0.5, tokens


def test_a_captured_step_gives_the_eager_hidden_states(engine):
    from mainspring.engine.attention import AttentionMetadata
    from mainspring.engine.decode_graphs import DecodeRow
    from mainspring.engine.model_runner import ModelRunner

    model, bs = engine.model, 16
    runner = ModelRunner(model, 64, bs, graphs="capture", max_batch=8, max_context=1024)
    g = torch.Generator().manual_seed(0)
    rows = []
    for n, table in zip([5, 40, 300], [[7], [3, 12, 9], list(range(20, 39))]):
        ids = torch.randint(0, model.config.vocab_size, (n + 1,), generator=g)
        meta = AttentionMetadata.build([], [(table, 0, n)], bs).to(torch.device("cuda"))
        with torch.inference_mode():
            model(ids[:n].cuda(), torch.arange(n, device="cuda"), runner.kv_cache, meta)
        rows.append(DecodeRow(int(ids[n]), n, table))
    with torch.inference_mode():
        graphed = runner.graphs.run(rows).float().clone()
        again = runner.graphs.run(rows).float().clone()  # a replay of the captured graph, not the capture run
        meta = AttentionMetadata.build([(r.block_table, r.position + 1) for r in rows], [], bs).to(torch.device("cuda"))
        eager = model(torch.tensor([r.token_id for r in rows], device="cuda"),
                      torch.tensor([r.position for r in rows], device="cuda"), runner.kv_cache, meta).float()
    assert runner.graphs.replays == 2 and set(runner.graphs.graphs) == {(4, 512)}
    assert torch.equal(graphed, again)
    scale = eager.abs().max().item()
    assert (graphed - eager).abs().max().item() <= 3e-2 * scale


@pytest.mark.parametrize("method,k", [("ngram", 6), ("draft", 3)])
def test_speculative_decoding_on_the_gpu_keeps_the_plain_greedy_picks(engine, loaded, method, k):
    """The drafts, the verify forward and the verifier on the GPU: every greedy token is the plain engine's pick
    for its prefix up to bf16 rounding (tests/engine/test_speculative.py checks the same on the CPU), and seeded
    sampling runs there too (the verifier's generators and index tensors on the logits' device)."""
    from mainspring.engine.config import EngineConfig
    from mainspring.engine.engine import LLMEngine
    from mainspring.engine.params import SamplingParams
    from mainspring.engine.speculative import SpeculativeConfig
    from tests.engine.test_speculative import greedy_gaps

    drafting = LLMEngine(loaded, EngineConfig(device="cuda", dtype="bf16", kv_cache_mb=256, max_num_batched_tokens=512,
                                              speculative=SpeculativeConfig(method, k=k)))
    prompts = [engine.tokenizer.encode(p) for p in PROMPTS + ["one two three four five one two three four five one"]]
    greedy = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    sampled = SamplingParams(temperature=0.8, seed=5, max_tokens=32, ignore_eos=True)
    outs = drafting.generate(prompts + prompts[:1], [greedy] * len(prompts) + [sampled])
    for prompt, out in zip(prompts, outs):
        assert max(greedy_gaps(engine, prompt, out.token_ids)) <= 0.5, (method, out.token_ids)
    assert all(len(o.token_ids) == 32 for o in outs)
    assert drafting.spec.num_draft_tokens > 0 and drafting.model.embed_tokens.weight.is_cuda


def test_int4_layers_on_the_gpu_compute_their_dequantized_weight():
    """torch's CUDA int4 kernel over the portable form (its own packing: column 2j in the high nibble, the widest
    k-tiles that divide K): the dequantized weight's product up to bf16 activations, at decode and prefill rows."""
    from mainspring.engine.quant import Int4Linear, cuda_inner_k_tiles, dequantize_int4, quantize_int4

    g = torch.Generator().manual_seed(0)
    for k, passes in ((576, 1), (576, 2), (1536, 1)):
        q = quantize_int4(torch.randn(960, k, generator=g) * 0.02, 32, passes)
        bias = torch.randn(960, generator=g)
        layer = Int4Linear(q, bias, device="cuda")
        assert layer.packed.is_cuda and layer.packed.shape[-1] == cuda_inner_k_tiles(q) // 2
        for rows in (1, 6, 40):
            x = torch.randn(rows, k, generator=g)
            want = x @ dequantize_int4(q).T + bias
            got = layer(x.to("cuda", torch.bfloat16)).float().cpu()
            assert ((got - want).norm() / want.norm()).item() < 1e-2, (k, passes, rows)


def test_the_fast_variant_on_the_gpu_runs_int4_with_ngram_drafts(loaded):
    """The -fast engine on CUDA: int4 layers on the GPU kernel, n-gram speculation, the engine's bf16. Every greedy
    token is the pick of the same int4 weights run on the CPU (bf16 activations there too), up to bf16 rounding."""
    from mainspring.config import Settings
    from mainspring.engine.config import EngineConfig
    from mainspring.engine.engine import LLMEngine
    from mainspring.engine.fast_variant import build_fast_engine
    from mainspring.engine.params import SamplingParams
    from mainspring.engine.quant import Int4Linear
    from tests.engine.test_speculative import greedy_gaps

    fast = build_fast_engine(Settings(device="cuda", dtype="bf16", kv_cache_mb=256), loaded)
    assert fast.kernel_choice.name == "int4-bf16" and fast.config.speculative.method == "ngram"
    assert isinstance(fast.model.lm_head, Int4Linear) and fast.model.lm_head.packed.is_cuda
    assert fast.model.embed_tokens.weight.is_cuda and fast.model.embed_tokens.weight.dtype == torch.bfloat16
    on_cpu = LLMEngine(loaded, EngineConfig(device="cpu", dtype="bf16", quantization="int4-bf16", kv_cache_mb=64))
    prompts = [fast.tokenizer.encode(p) for p in PROMPTS + ["one two three four five one two three four five one"]]
    outs = fast.generate(prompts, SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True))
    for prompt, out in zip(prompts, outs):
        assert max(greedy_gaps(on_cpu, prompt, out.token_ids)) <= 0.5, out.token_ids
    assert fast.spec.num_draft_tokens > 0 and all(len(o.token_ids) == 32 for o in outs)


def test_sparse_attention_on_the_gpu_gives_the_cpus_answer():
    from tests.engine.test_sparse_attention import check_segment_on

    check_segment_on(torch.device("cuda"))


def test_kv_policies_on_the_gpu_score_as_on_the_cpu(loaded):
    """An engine on CUDA with a cold tier: cold tier, window and SnapKV run there, each teacher-forced policy scores
    a text as the same policy does on the CPU (bf16 both, so per-token losses within bf16 rounding), and a windowed
    decode and a SnapKV prompt run to the end and give every block back."""
    from mainspring.engine.config import EngineConfig
    from mainspring.engine.engine import LLMEngine
    from mainspring.engine.kv_policy import KVPolicy, KVPolicyConfig
    from mainspring.engine.params import SamplingParams
    from mainspring.engine.perplexity import perplexity

    ids = torch.randint(100, loaded.config.vocab_size, (512,), generator=torch.Generator().manual_seed(0)).tolist()
    config = EngineConfig(kv_cache_mb=96, dtype="bf16", kv_policy=KVPolicyConfig(cold_bits=8))
    engines = {dev: LLMEngine(loaded, dataclasses.replace(config, device=dev)) for dev in ("cpu", "cuda")}
    gpu = engines["cuda"]
    assert gpu.runner.cold_store is not None and gpu.runner.cold_store.k_q.is_cuda
    for policy in (KVPolicy(hot_tokens=128), KVPolicy(window=128)):
        got, want = (perplexity(engines[dev], ids, policy, chunk=32) for dev in ("cuda", "cpu"))
        if policy.hot_tokens:
            assert got.peak_cold_blocks >= 512 // 16 - 128 // 16 - 2
        diffs = [abs(a - b) for a, b in zip(got.nll, want.nll)]
        assert sum(diffs) / len(diffs) <= 0.05 and max(diffs) <= 0.5, (policy, max(diffs))
    params = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True, attention_window=48)
    outs = gpu.generate([ids[:200], ids[:300]], [params, SamplingParams(temperature=0, max_tokens=8,
                                                                         kv_snap_tokens=96)])
    assert [len(o.token_ids) for o in outs] == [64, 8]
    assert gpu.block_manager.num_free_blocks == gpu.block_manager.num_blocks


def test_the_kv_disk_tier_reloads_a_gpus_blocks_after_a_restart(loaded, tmp_path):
    """bf16 blocks copied off the GPU at a flush, read back into a new engine's GPU cache bit for bit, and decoded
    from (each token the first engine's pick up to bf16 rounding: a prefill and a cached prefix take other kernels)."""
    from mainspring.engine.config import EngineConfig
    from mainspring.engine.engine import LLMEngine
    from mainspring.engine.kv_cache import hash_block_tokens
    from mainspring.engine.params import SamplingParams
    from tests.engine.test_speculative import greedy_gaps

    config = EngineConfig(device="cuda", dtype="bf16", kv_cache_mb=64, kv_disk_cache_mb=64, kv_disk_dir=str(tmp_path))
    prompt = torch.randint(100, loaded.config.vocab_size, (300,), generator=torch.Generator().manual_seed(1)).tolist()
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    first = LLMEngine(loaded, config)
    want = first.generate([prompt], params)[0].token_ids
    assert first.flush_kv_cache() >= 299 // 16
    again = LLMEngine(loaded, config)
    out = again.generate([prompt], params)[0]
    assert out.usage.cached_tokens == 299 // 16 * 16 and again.stats()["kv_disk_hits"] == 299 // 16
    blocks = [dict((h, b) for b, h in e.block_manager.registered_blocks()) for e in (first, again)]
    parent, prompt_hashes = None, []
    for i in range(299 // 16):  # the prompt's full blocks: what the flush wrote and the restart read
        parent = hash_block_tokens(parent, prompt[i * 16 : (i + 1) * 16], None)
        prompt_hashes.append(parent)
    for h in prompt_hashes:
        saved, loaded_back = (e.runner.cache[:, :, b * 16 : (b + 1) * 16] for e, b in zip((first, again),
                                                                                         (blocks[0][h], blocks[1][h])))
        assert saved.is_cuda and torch.equal(saved, loaded_back)
    assert max(greedy_gaps(first, prompt, out.token_ids)) <= 0.5, (out.token_ids, want)

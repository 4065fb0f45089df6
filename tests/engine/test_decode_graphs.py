"""The decode step in the fixed shapes CUDA graphs replay (engine/decode_graphs.py), run eagerly on the CPU ("static"
mode): padded batches and block tables give the same hidden states as the eager step, padding rows write only the
scratch block, unwritten cache slots are never read, and an engine on it decodes the same greedy tokens. The
capture itself needs a GPU (tests/engine/test_cuda.py)."""

from __future__ import annotations

import pytest
import torch

from mainspring.engine.attention import AttentionMetadata
from mainspring.engine.config import EngineConfig
from mainspring.engine.decode_graphs import DecodeRow, bucket_of, buckets
from mainspring.engine.engine import LLMEngine
from mainspring.engine.model import CausalLM
from mainspring.engine.model_runner import ModelRunner
from mainspring.engine.params import SamplingParams
from mainspring.engine.placement import PlacementError

BLOCK = 16


def test_buckets_double_up_to_the_limit():
    assert buckets(64) == [1, 2, 4, 8, 16, 32, 64]
    assert buckets(48) == [1, 2, 4, 8, 16, 32, 48]
    assert buckets(2048, 256) == [256, 512, 1024, 2048]
    assert buckets(1) == [1]
    assert bucket_of([1, 2, 4], 3) == 4 and bucket_of([1, 2, 4], 4) == 4 and bucket_of([1, 2, 4], 5) is None


@pytest.fixture(scope="module")
def model(embedded):
    return CausalLM.from_weights(embedded.config, embedded.state_dict)


def _prefill(runner: ModelRunner, table: list[int], ids: list[int]) -> None:
    meta = AttentionMetadata.build([], [(table, 0, len(ids))], BLOCK)
    with torch.inference_mode():
        runner.model(torch.tensor(ids), torch.arange(len(ids)), runner.kv_cache, meta)


def test_the_static_step_matches_the_eager_one_and_reads_no_unwritten_slot(model):
    num_blocks = 64
    runner = ModelRunner(model, num_blocks, BLOCK, graphs="static", max_batch=8, max_context=1024)
    runner.cache[:, :, : num_blocks * BLOCK] = float("nan")  # what a fresh cache may hold: only written slots count
    g = torch.Generator().manual_seed(0)
    # three rows, scattered blocks; 300 tokens crosses the first context bucket (256)
    lengths, tables = [5, 40, 300], [[7], [3, 12, 9], list(range(20, 39))]
    rows = []
    for n, table in zip(lengths, tables):
        ids = torch.randint(0, model.config.vocab_size, (n + 1,), generator=g).tolist()
        _prefill(runner, table, ids[:n])
        rows.append(DecodeRow(ids[n], n, table))
    scratch = runner.cache[:, :, num_blocks * BLOCK:].clone()
    with torch.inference_mode():
        static = runner.graphs.run(rows).clone()
        # the scratch block took the padding row's writes (bucket 4 for 3 rows) and nothing else changed there
        assert not torch.equal(runner.cache[:, :, num_blocks * BLOCK:], scratch)
        eager_meta = AttentionMetadata.build([(r.block_table, r.position + 1) for r in rows], [], BLOCK)
        eager = model(torch.tensor([r.token_id for r in rows]), torch.tensor([r.position for r in rows]),
                      runner.kv_cache, eager_meta)
    assert runner.graphs.replays == 1 and set(runner.graphs.graphs) == {(4, 512)}
    assert static.shape == eager.shape and torch.isfinite(static).all()
    torch.testing.assert_close(static, eager, atol=2e-4, rtol=2e-4)
    # the blocks no row holds are as they were: still NaN
    held = {b for t in tables for b in t}
    free = [b for b in range(num_blocks) if b not in held]
    assert torch.isnan(runner.cache[:, :, torch.tensor(free[:4]) * BLOCK]).all()


def test_a_step_beyond_the_buckets_runs_eagerly(model):
    runner = ModelRunner(model, 64, BLOCK, graphs="static", max_batch=2, max_context=256)
    rows = [DecodeRow(1, 3, [0]) for _ in range(3)]  # three rows, the largest bucket holds two
    assert runner.graphs.run(rows) is None
    assert runner.graphs.run([DecodeRow(1, 300, list(range(19)))]) is None  # past the longest context
    assert runner.graphs.replays == 0 and not runner.graphs.graphs


def test_an_engine_on_static_graphs_decodes_the_same_tokens(embedded):
    prompts = ["The quick brown fox jumps over the lazy dog because", "1, 2, 3, 4, 5,", "Write a haiku about the sea."]
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    outs = {}
    for mode in ("off", "static"):
        engine = LLMEngine(embedded, EngineConfig(kv_cache_mb=64, max_num_seqs=4, decode_graphs=mode))
        outs[mode] = [o.token_ids for o in engine.generate(prompts, params)]
        if mode == "static":
            assert engine.runner.graphs.replays >= 20  # the decode steps went through the fixed shapes
            stats = engine.stats()
            assert stats["decode_graphs"] == "static" and stats["decode_graph_steps"] == engine.runner.graphs.replays
            assert stats["decode_graphs_captured"] >= 1 and stats["decode_graphs_failed"] is None
            assert engine.block_manager.num_blocks * BLOCK == engine.runner.cache.shape[2] - BLOCK  # + scratch
        else:
            assert engine.runner.graphs is None
    assert outs["static"] == outs["off"]


def test_capturing_needs_cuda(embedded):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: tests/engine/test_cuda.py captures there")
    with pytest.raises(PlacementError, match="needs CUDA"):
        LLMEngine(embedded, EngineConfig(kv_cache_mb=16, decode_graphs="capture"))


def test_a_capture_that_fails_leaves_every_step_eager(model, monkeypatch):
    runner = ModelRunner(model, 64, BLOCK, graphs="static", max_batch=4, max_context=256)

    def refuse(b, c):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(runner.graphs, "_capture", refuse)
    rows = [DecodeRow(1, 3, [0])]
    assert runner.graphs.run(rows) is None and "not permitted" in runner.graphs.failed
    monkeypatch.undo()
    assert runner.graphs.run(rows) is None and runner.graphs.replays == 0  # not tried again

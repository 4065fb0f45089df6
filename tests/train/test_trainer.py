"""The GRPO loop end to end on a tiny random Llama with the embedded tokenizer (fast), and one real
run of the embedded model: resume equivalence, scorer failures counted, clear errors."""

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from mainspring.engine.loader import LoadedModel
from mainspring.train.checkpoint import CheckpointError
from mainspring.train.config import TrainConfig
from mainspring.train.domains.base import Domain, DomainSettings, Sample, Score
from mainspring.train.trainer import run_training
from tests.ports import free_port
from tests.train.tiny import tiny_config, tiny_state


class VowelScorer:
    """A reward with variance even for random text: the share of vowels among letters."""

    def score(self, sample, completion):
        letters = [c for c in completion.lower() if c.isalpha()]
        return Score(sum(c in "aeiou" for c in letters) / len(letters) if letters else 0.0)


class FlakyScorer:
    """Raises on every third call and returns NaN on every fifth: the run must go on."""

    def __init__(self):
        self.calls = 0

    def score(self, sample, completion):
        self.calls += 1
        if self.calls % 3 == 0:
            raise RuntimeError("verifier crashed")
        if self.calls % 5 == 0:
            return Score(math.nan)
        return VowelScorer().score(sample, completion)


def domain(name="vowels", scorer=None, n=12):
    def s(i, split):
        return Sample(f"{split}{i}", name, ({"role": "user", "content": f"Say something about the number {i}."},))
    return Domain(name, [s(i, "t") for i in range(n)], [s(i, "e") for i in range(n, n + 4)],
                  scorer or VowelScorer(), DomainSettings(max_tokens=6, temperature=1.0))


@pytest.fixture(scope="module")
def tiny(embedded):
    cfg = tiny_config(vocab=embedded.config.vocab_size, hidden=32, context=256)
    return LoadedModel("tiny", embedded.path, cfg, tiny_state(cfg), embedded.tokenizer)


def config(**kw):
    base = {"domains": [{"name": "vowels"}], "steps": 3, "prompts_per_step": 2, "group_size": 3, "lr": 1e-2,
            "threads": 1, "eval_before": False, "eval_after": False, "export": False, "checkpoint_every": 1,
            "keep_checkpoints": 3, "micro_batch": 4}
    return TrainConfig.parse({**base, **kw})


def losses(run_dir):
    return [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_a_resumed_run_continues_exactly(tiny, tmp_path):
    full = run_training(config(), tmp_path / "full", domains={"vowels": domain()}, loaded=tiny)
    assert full.steps_done == 3
    cut = tmp_path / "cut"
    stopped = run_training(config(), cut, domains={"vowels": domain()}, loaded=tiny,
                           should_stop=lambda: len(losses(cut)) >= 2 if (cut / "metrics.jsonl").exists() else False)
    assert stopped.stopped and stopped.steps_done == 2
    resumed = run_training(config(), cut, resume=True, domains={"vowels": domain()}, loaded=tiny)
    assert resumed.steps_done == 3
    a, b = losses(tmp_path / "full"), losses(cut)
    assert [m["step"] for m in b] == [1, 2, 3]
    # GRPO's loss at ratio 1 is ~0 by construction (advantages sum to zero per group), so compare
    # what it drives: the same rollouts, the same gradient, the same weights after the step
    assert b[2]["reward"] == pytest.approx(a[2]["reward"])
    assert b[2]["loss"] == pytest.approx(a[2]["loss"], abs=1e-7)
    assert a[2]["grad_norm"] > 0
    assert b[2]["grad_norm"] == pytest.approx(a[2]["grad_norm"], rel=1e-5)
    wa = load_file(str(tmp_path / "full" / "checkpoints" / "step-000003" / "weights.safetensors"))
    wb = load_file(str(cut / "checkpoints" / "step-000003" / "weights.safetensors"))
    w2 = load_file(str(cut / "checkpoints" / "step-000002" / "weights.safetensors"))
    assert all(torch.allclose(wa[k], wb[k], atol=1e-6) for k in wa)
    assert not all(torch.equal(wa[k], w2[k]) for k in wa)  # step 3 did move the weights


def test_periodic_held_out_eval_feeds_the_monitor(tiny, tmp_path):
    events = []
    run_training(config(steps=3, eval_every=2, checkpoint_every=5), tmp_path, domains={"vowels": domain()},
                 loaded=tiny, on_event=events.append)
    m = losses(tmp_path)
    assert "heldout_vowels" not in m[0] and 0 <= m[1]["heldout_vowels"] <= 1 and "heldout_vowels" not in m[2]
    periodic = [e for e in events if e.kind == "eval"]
    assert [(e.step, e.data["phase"]) for e in periodic] == [(2, "periodic")]
    assert periodic[0].data["vowels"]["mean"] == m[1]["heldout_vowels"]


def test_resume_refuses_a_checkpoint_of_another_run(tiny, tmp_path):
    run_training(config(steps=1), tmp_path, domains={"vowels": domain()}, loaded=tiny)
    with pytest.raises(CheckpointError, match="lora"):
        run_training(config(steps=2, lora={"r": 4}), tmp_path, resume=True, domains={"vowels": domain()}, loaded=tiny)


def test_scorer_failures_score_zero_and_are_counted(tiny, tmp_path):
    res = run_training(config(steps=2, dynamic_sampling=False), tmp_path,
                       domains={"vowels": domain(scorer=FlakyScorer())}, loaded=tiny)
    assert res.steps_done == 2
    m = losses(tmp_path)
    assert sum(x["scorer_errors"] for x in m) >= 3
    assert any("verifier crashed" in e for x in m for e in x["scorer_error_examples"])
    assert any("non-finite" in e for x in m for e in x["scorer_error_examples"])


def test_eval_gate_and_export_on_the_tiny_model(tiny, tmp_path):
    from mainspring.engine.loader import load_model

    res = run_training(config(steps=1, eval_before=True, eval_after=True, export=True, gate_delta=1.0), tmp_path,
                       domains={"vowels": domain()}, loaded=tiny)
    assert res.gate_passed is True
    assert set(res.eval_before) == {"vowels"} and res.eval_before["vowels"]["n"] == 4
    back = load_model(res.export_dir)
    assert back.config.num_hidden_layers == 2
    assert (tmp_path / "report.md").read_text().count("| vowels |") == 1
    assert (tmp_path / "reward.png").stat().st_size > 1000


def test_bad_configs_name_the_problem(tmp_path):
    from mainspring.train.config import TrainConfigError

    with pytest.raises(TrainConfigError, match="group_size"):
        TrainConfig.parse({"domains": [{"name": "json"}], "group_size": 1})
    with pytest.raises(TrainConfigError, match="domain listed twice"):
        TrainConfig.parse({"domains": [{"name": "json"}, {"name": "json"}]})
    with pytest.raises(TrainConfigError, match="stepz"):
        TrainConfig.parse({"domains": [{"name": "json"}], "stepz": 3})
    bad = tmp_path / "bad.yaml"
    bad.write_text("domains: [json\n")
    with pytest.raises(TrainConfigError, match="not valid YAML"):
        TrainConfig.load(bad)


@pytest.mark.slow
def test_torchrun_two_processes_train_one_run(tiny, tmp_path):
    """`torchrun --nproc-per-node 2 -m mainspring train`: both ranks roll out their share, rank 0 writes."""
    import os
    import subprocess
    import sys

    from mainspring.train.export import export_model
    from mainspring.train.policy import Policy

    model = export_model(Policy(tiny.config, tiny.state_dict, None), tiny, tmp_path / "tiny-model", {"base": "tiny"})
    data = tmp_path / "vowels.jsonl"
    data.write_text("\n".join(json.dumps({"id": f"p{i}", "prompt": f"Say something about {i}.",
                                          "split": "eval" if i >= 8 else "train"}) for i in range(10)))
    cfg = tmp_path / "run.yaml"
    cfg.write_text(f"model: {model}\ndomains: [{{name: vowels, data: {data}, scorer: tests.train.scorers:vowels, "
                   "max_tokens: 6}]\nsteps: 2\nprompts_per_step: 4\ngroup_size: 2\nlora: {r: 4}\nthreads: 1\n"
                   "eval_size: 2\nexport: false\n")
    out = tmp_path / "run"
    port = free_port()  # torchrun's --master-port 0 waits forever
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                           "--master-addr", "127.0.0.1", "--master-port", str(port),
                           "-m", "mainspring", "train", str(cfg), "--out", str(out)],
                          capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]  # one writer, not two
    assert all(m["groups"] == 2 for m in metrics)  # each rank generated its half of the 4 prompts
    assert (out / "changes.json").exists()


def torchrun_env(rank: int, world: int, port: int) -> dict[str, str]:
    """The variables torchrun gives one rank: its run id, the rendezvous on 127.0.0.1:`port`, rank and world."""
    return {"TORCHELASTIC_RUN_ID": "test", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
            "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world)}


def launched_by_torchrun(monkeypatch) -> None:
    """This process as the one rank of a torchrun world, with a free rendezvous port."""
    for k, v in torchrun_env(0, 1, free_port()).items():
        monkeypatch.setenv(k, v)


def test_a_torchrun_rank_leaves_its_process_group_only_after_a_good_run(monkeypatch):
    """A run that ends well destroys its group (a process that exits with a gloo group up can abort in
    gloo's threads, and torchrun then calls the run failed); a failed one leaves it alone, since a
    teardown could wait forever on a peer stuck in a collective."""
    import torch.distributed as dist

    from mainspring.train.cli import _distributed

    launched_by_torchrun(monkeypatch)
    try:
        with _distributed() as rank:
            assert rank == 0 and dist.is_initialized()
        assert not dist.is_initialized()
        launched_by_torchrun(monkeypatch)
        with pytest.raises(RuntimeError, match="a failed step"), _distributed():
            raise RuntimeError("a failed step")
        assert dist.is_initialized()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _torchrun_rank_sums(rank: int, port: int, out: str) -> None:
    import os
    from contextlib import nullcontext

    import torch.distributed as dist

    from mainspring.train.cli import _distributed
    from mainspring.train.update import World
    from tests.simulated_cuda import SimulatedCuda

    os.environ.update(torchrun_env(rank, 2, port))
    torch.set_num_threads(1)
    with nullcontext() if torch.cuda.is_available() else SimulatedCuda(), torch.no_grad():
        assert torch.cuda.is_available()
        with _distributed():
            total = World().all_reduce(torch.tensor([rank + 1.0])).item()
        Path(out, str(rank)).write_text(f"{total} {dist.is_initialized()}")


def test_torchrun_ranks_where_a_gpu_is_visible_still_sum_cpu_gradients(tmp_path):
    """The policy trains on the CPU even on a GPU machine: its all-reduce must go over gloo, since NCCL
    refuses CPU tensors (and a CPU-only torch has no NCCL at all), and so must the barrier before the
    teardown (two ranks sharing one GPU is what NCCL refuses). A real GPU where there is one."""
    import torch.multiprocessing as mp

    mp.start_processes(_torchrun_rank_sums, args=(free_port(), str(tmp_path)), nprocs=2, join=True,
                       start_method="spawn")
    assert [(tmp_path / str(r)).read_text() for r in (0, 1)] == ["3.0 False", "3.0 False"]


@pytest.mark.parametrize("lora", [None, {"r": 4}])
def test_kl_to_the_reference_and_several_updates_per_batch(tiny, tmp_path, lora):
    """With beta > 0 the KL to the starting model is 0 before any update and grows after one (the
    reference is a frozen copy under full weights, the adapters switched off under LoRA); with mu = 2
    the second update sees ratios != 1, and some get clipped."""
    res = run_training(config(steps=2, kl_beta=0.1, updates_per_batch=2, lora=lora, lr=5e-2, clip_high=0.01,
                              clip_low=0.01, dynamic_sampling=False), tmp_path, domains={"vowels": domain()},
                       loaded=tiny)
    assert res.steps_done == 2
    m = losses(tmp_path)
    assert m[1]["kl"] > 0
    assert m[0]["clip_frac"] > 0 or m[1]["clip_frac"] > 0
    assert all(0 < x["entropy"] < 20 for x in m)  # nats per token, what the monitor watches for collapse

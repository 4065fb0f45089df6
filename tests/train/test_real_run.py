"""A real GRPO run of the embedded SmolLM2-135M-Instruct on the shipped `json` domain (2 steps), and
`mainspring train` as a user runs it: a real process, exit codes, the run folder."""

import json
import os
import subprocess
import sys

import pytest
import torch

from mainspring.engine.params import SamplingParams
from mainspring.train.config import TrainConfig
from mainspring.train.trainer import Trainer, run_training

pytestmark = pytest.mark.slow


def test_two_real_steps_of_the_embedded_model(embedded, tmp_path):
    cfg = TrainConfig.parse({"domains": [{"name": "json", "max_tokens": 24}], "steps": 2, "prompts_per_step": 2,
                             "group_size": 4, "eval_size": 4, "lr": 1e-3, "checkpoint_every": 2})
    events = []
    res = run_training(cfg, tmp_path, loaded=embedded, on_event=events.append)
    steps = [e.data for e in events if e.kind == "step"]
    assert len(steps) == 2 and res.steps_done == 2
    for m in steps:
        assert all(torch.isfinite(torch.tensor(m[k])) for k in ("loss", "reward", "grad_norm"))
        assert 0.0 <= m["reward_json"] <= 1.0
        # the G samples of a prompt share its KV: G-1 of every G prompts come from the prefix cache
        assert m["cached_tokens"] >= m["prompt_tokens"] // 2
        assert m["sync_s"] > 0
    started = next(e for e in events if e.kind == "started").data
    assert 1_000_000 < started["trainable_params"] < 5_000_000  # LoRA r=8 on every linear: ~2% of 135M
    assert res.gate_passed is not None and set(res.eval_after) == {"json"}
    assert (tmp_path / "report.md").exists() and (tmp_path / "eval.png").exists()
    assert res.export_dir is not None and (res.export_dir / "adapter" / "adapter_config.json").exists()


def test_weights_synced_into_the_engine_change_what_it_generates(embedded, tmp_path):
    cfg = TrainConfig.parse({"domains": [{"name": "json", "max_tokens": 16}], "steps": 1, "prompts_per_step": 1,
                             "group_size": 2, "lora": None, "eval_before": False, "eval_after": False,
                             "export": False})
    t = Trainer(cfg, tmp_path, loaded=embedded)
    prompt = t.engine.tokenizer.encode_chat([{"role": "user", "content": "Name a colour."}])
    greedy = SamplingParams(temperature=0.0, max_tokens=12)
    before = t.engine.generate(prompt, greedy)[0].token_ids
    with torch.no_grad():
        t.policy.model.lm_head.weight[before[0]] -= 50.0  # make the first greedy token impossible
    report = t.policy.sync_into(t.engine)
    assert report.tensors > 0
    after = t.engine.generate(prompt, greedy)[0].token_ids
    assert after[0] != before[0]
    # the starting weights the run was built from are untouched
    assert not torch.equal(t.engine.model.lm_head.weight, embedded.state_dict["model.embed_tokens.weight"])


def cli(*args):
    return subprocess.run([sys.executable, "-m", "mainspring", "train", *args], capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "60"}, timeout=600)


def test_cli_rejects_bad_configs_with_exit_2(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("domains: [{name: json}]\ngroup_size: 1\n")
    proc = cli(str(bad))
    assert proc.returncode == 2 and "group_size" in proc.stderr and "Traceback" not in proc.stderr
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("domains: [{name: poetry}]\nsteps: 1\n")
    proc = cli(str(unknown), "--out", str(tmp_path / "run"))
    assert proc.returncode == 2 and "unknown domain 'poetry'" in proc.stderr and "Traceback" not in proc.stderr
    assert cli(str(tmp_path / "missing.yaml")).returncode == 2


def test_cli_trains_and_resumes(embedded, tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("domains: [{name: math, max_tokens: 8}]\nsteps: 1\nprompts_per_step: 1\ngroup_size: 2\n"
                   "eval_before: false\neval_after: false\nexport: false\n")
    out = tmp_path / "run"
    proc = cli(str(cfg), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 1
    again = cli(str(cfg), "--out", str(out))
    assert again.returncode == 2 and "--resume" in again.stderr
    cfg.write_text(cfg.read_text().replace("steps: 1", "steps: 2"))
    resumed = cli(str(cfg), "--out", str(out), "--resume")
    assert resumed.returncode == 0, resumed.stderr
    steps = [json.loads(ln)["step"] for ln in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]

"""GRPO step time: Mainspring's trainer (rollouts on LLMEngine) vs TRL's GRPOTrainer, side by side.

Same model (the embedded SmolLM2-135M-Instruct, fp32), same prompts (the `json` domain's training
split, in the same order), same G, max completion tokens, temperature, LoRA (r 8, alpha 16, every
linear), learning rate, beta 0 and thread count. Each trainer runs in its own process (peak memory
is its own): one warm-up step, then `--steps` measured; the table shows medians.

    python bench/train.py                       # ours vs TRL, 2 threads, 3 measured steps
    python bench/train.py --peers ours          # without TRL (pip install trl to compare)
    python bench/train.py --demo                # the multi-domain demo and the conflicting-domains demo

TRL is a bench-only peer: `pip install -e '.[bench]'` brings it; CI never installs it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
RESULTS = ROOT / "bench" / "results"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def workload(args) -> dict:
    return {"prompts_per_step": args.prompts, "group_size": args.group, "max_tokens": args.max_tokens,
            "temperature": 1.0, "lr": 2e-4, "lora_r": 8, "lora_alpha": 16, "threads": args.threads,
            "steps": args.steps + 1}


def child_ours(w: dict, out: Path) -> dict:
    from mainspring.train.config import TrainConfig
    from mainspring.train.trainer import run_training

    cfg = TrainConfig.parse({
        "domains": [{"name": "json", "max_tokens": w["max_tokens"], "temperature": w["temperature"]}],
        "steps": w["steps"], "prompts_per_step": w["prompts_per_step"], "group_size": w["group_size"],
        "lr": w["lr"], "lora": {"r": w["lora_r"], "alpha": w["lora_alpha"]}, "threads": w["threads"],
        "eval_before": False, "eval_after": False, "export": False, "checkpoint_every": 10_000,
        "dynamic_sampling": False, "interference": "sum", "micro_batch": w["prompts_per_step"] * w["group_size"]})
    steps = []
    run_training(cfg, out, on_event=lambda e: steps.append(e.data) if e.kind == "step" else None)
    measured = steps[1:]
    return {"step_s": [m["step_s"] for m in measured], "rollout_s": [m["rollout_s"] for m in measured],
            "rollout_tokens": [m["tokens"] for m in measured],
            "rollout_tok_s": [m["rollout_tokens_per_s"] for m in measured],
            "update_s": [m["update_s"] for m in measured], "sync_s": [m["sync_s"] for m in measured]}


def child_trl(w: dict, out: Path) -> dict:
    import torch
    import transformers
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from mainspring.config import get_settings
    from mainspring.engine.loader import ensure_hf_dir, resolve_model_path
    from mainspring.train.config import DomainSpec
    from mainspring.train.domains.registry import load_domain

    torch.set_num_threads(w["threads"])
    hf_dir = ensure_hf_dir(resolve_model_path("smollm2"), get_settings().cache_dir)
    domain = load_domain(DomainSpec(name="json"), 0)
    # our sampler's first draws, in order (static weights, one domain: a seeded shuffle)
    from mainspring.train.sampler import DomainSampler

    sampler = DomainSampler({"json": domain}, "static", 0)
    drawn = [sampler.draw(w["prompts_per_step"]) for _ in range(w["steps"])]
    rows = [{"prompt": list(s.messages), "sample_id": s.id} for step in drawn for s in step]
    by_id = {s.id: s for s in domain.train}

    def reward(prompts, completions, sample_id, **_):
        return [domain.scorer.score(by_id[i], c[0]["content"] if isinstance(c, list) else c).total
                for i, c in zip(sample_id, completions)]

    gen = {"s": 0.0, "tokens": 0}
    original = transformers.GenerationMixin.generate

    def timed_generate(self, *a, **kw):  # rollout time and tokens, counted as ours are (up to EOS)
        t0 = time.perf_counter()
        res = original(self, *a, **kw)
        gen["s"] += time.perf_counter() - t0
        ids = kw.get("input_ids", a[0] if a else None)
        new = res[:, ids.shape[1]:] if ids is not None else res
        eos = self.generation_config.eos_token_id
        eos = set(eos if isinstance(eos, list) else [eos])
        for row in new.tolist():
            n = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
            gen["tokens"] += n
        return res

    transformers.GenerationMixin.generate = timed_generate
    times, marks = [], {}

    class Timer(TrainerCallback):
        def on_step_begin(self, *a, **k):
            marks["t"] = time.perf_counter()
            marks["g"], marks["n"] = gen["s"], gen["tokens"]

        def on_step_end(self, *a, **k):
            times.append((time.perf_counter() - marks["t"], gen["s"] - marks["g"], gen["tokens"] - marks["n"]))

    n = w["prompts_per_step"] * w["group_size"]
    cfg = GRPOConfig(output_dir=str(out), per_device_train_batch_size=n, num_generations=w["group_size"],
                     max_completion_length=w["max_tokens"], learning_rate=w["lr"], beta=0.0,
                     temperature=w["temperature"], max_steps=w["steps"], logging_steps=1, save_strategy="no",
                     report_to=[], use_cpu=True, bf16=False, shuffle_dataset=False, seed=0,
                     dataloader_num_workers=0)
    model = AutoModelForCausalLM.from_pretrained(str(hf_dir), torch_dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(str(hf_dir))
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=cfg, train_dataset=Dataset.from_list(rows),
                          processing_class=tok, callbacks=[Timer()],
                          peft_config=LoraConfig(r=w["lora_r"], lora_alpha=w["lora_alpha"],
                                                 target_modules="all-linear"))
    trainer.train()
    measured = times[1:]
    return {"step_s": [t[0] for t in measured], "rollout_s": [t[1] for t in measured],
            "rollout_tokens": [t[2] for t in measured],
            "rollout_tok_s": [t[2] / t[1] if t[1] else 0 for t in measured]}


def run_child(peer: str, w: dict) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(w["threads"]), "OMP_WAIT_POLICY": "PASSIVE"}
    res = subprocess.run([sys.executable, __file__, "--child", peer, "--workload", json.dumps(w)],
                         capture_output=True, text=True, env=env)
    if res.returncode != 0:
        raise SystemExit(f"{peer} failed:\n{res.stderr[-4000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def markdown(report: dict) -> str:
    rows = report["peers"]
    lines = [f"GRPO step, {report['workload']['prompts_per_step']} prompts x G={report['workload']['group_size']}, "
             f"{report['workload']['max_tokens']} max new tokens, LoRA r=8, {report['workload']['threads']} threads, "
             f"{report['cpu']} (median of {len(next(iter(rows.values()))['step_s'])} steps after a warm-up):", "",
             "| trainer | step s | rollout s | rollout tok/s | peak RSS MB |", "|---|---|---|---|---|"]
    for name, r in rows.items():
        lines.append(f"| {name} | {med(r['step_s']):.1f} | {med(r['rollout_s']):.1f} | {med(r['rollout_tok_s']):.1f} | "
                     f"{r['peak_rss_mb']:.0f} |")
    if "ratio_step" in report:
        lines += ["", f"Ours is **{report['ratio_step']:.2f}x** faster per step than TRL GRPOTrainer; rollouts "
                      f"{report['ratio_rollout']:.2f}x the tokens/s."]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child")
    ap.add_argument("--workload")
    ap.add_argument("--peers", default="ours,trl")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--demo", action="store_true", help="run bench/train_demo.py's two demos instead")
    ap.add_argument("--out", default=None, help="results JSON (default bench/results/train.json, or train_demo.json)")
    ap.add_argument("--update-readme", action="store_true")
    args, rest = ap.parse_known_args()
    if rest and not args.demo:
        ap.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.child:
        import tempfile

        w = json.loads(args.workload)
        with tempfile.TemporaryDirectory() as tmp:
            res = (child_ours if args.child == "ours" else child_trl)(w, Path(tmp))
        res["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(json.dumps(res))
        return
    if args.demo:
        from train_demo import main as demo_main

        demo_main([a for a in sys.argv[1:] if a != "--demo"])
        return
    args.out = args.out or str(RESULTS / "train.json")
    w = workload(args)
    report = {"cpu": cpu_model(), "workload": w, "load_before": os.getloadavg()[0], "peers": {}}
    for peer in args.peers.split(","):
        print(f"running {peer} ...", file=sys.stderr)
        report["peers"][peer] = run_child(peer, w)
    report["load_after"] = os.getloadavg()[0]
    p = report["peers"]
    if "ours" in p and "trl" in p:
        report["ratio_step"] = med(p["trl"]["step_s"]) / med(p["ours"]["step_s"])
        report["ratio_rollout"] = med(p["ours"]["rollout_tok_s"]) / med(p["trl"]["rollout_tok_s"])
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(markdown(report))
    if args.update_readme:
        from readme_table import write_table

        write_table("train", args.out, markdown)


if __name__ == "__main__":
    main()

"""The two training demos of `python bench/train.py --demo`, each a real run of the embedded model.

1. multi-domain: GRPO across the shipped domains in one run (bench/train_configs/demo.yaml); held-out
   greedy eval before and after with paired bootstrap CIs; passes when at least two domains improve
   with an interval that excludes zero and the gate (no domain down by more than delta) is green.
2. conflicting domains: `terse` ("answer in one word") vs `verbose` ("answer in a full sentence")
   over near-identical prompts in a skewed mix (6 terse prompts to 1 verbose: one large domain and
   a small one), trained five ways from the same start: the naive summed loss (interference: sum),
   the same with both domains in every step (the control for PCGrad's sampling), per-domain
   optimizers (weights), the same with terse's learning rate cut to a quarter, and PCGrad (every
   domain in every step); same steps and seed. Shows which keep the no-regression gate green.
   `conflict_same` repeats it over the very same prompts with no style asked for (user domains over
   one data file), where only the rewards disagree.

    python bench/train.py --demo                     # the multi-domain run and the conflict demo
    python bench/train.py --demo --only conflict     # one of them (multi, conflict, conflict_same)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "bench" / "train_configs"
RESULTS = ROOT / "bench" / "results"


def run(config_path: Path, overrides: dict, run_dir: Path) -> dict:
    from mainspring.train.config import TrainConfig
    from mainspring.train.trainer import run_training

    raw = {**yaml.safe_load(config_path.read_text()), **overrides}
    cfg = TrainConfig.parse(raw, str(config_path))
    t0 = time.time()
    last = {}

    def on_event(e):
        if e.kind == "step":
            last.update(e.data)
            rewards = " ".join(f"{k[7:]}={v:.2f}" for k, v in e.data.items() if k.startswith("reward_"))
            print(f"  step {e.step}/{cfg.steps} {e.data['step_s']:.1f}s {rewards}", file=sys.stderr, flush=True)
        elif e.kind == "eval":
            means = " ".join(f"{k}={v['mean']:.3f}" for k, v in e.data.items() if isinstance(v, dict))
            print(f"  eval {e.data['phase']}: {means}", file=sys.stderr, flush=True)

    res = run_training(cfg, run_dir, on_event=on_event)
    changes = json.loads((run_dir / "changes.json").read_text()) if (run_dir / "changes.json").exists() else {}
    from train import cpu_model

    return {"config": raw, "cpu": cpu_model(), "seconds": time.time() - t0, "steps": res.steps_done,
            "gate_passed": res.gate_passed,
            "changes": changes, "run_dir": str(run_dir),
            "improved": sorted(n for n, c in changes.items() if c["significant"] and c["delta"] > 0)}


def multi_domain(out_dir: Path) -> dict:
    print("multi-domain demo", file=sys.stderr)
    r = run(CONFIGS / "demo.yaml", {}, out_dir / "demo")
    r["passed"] = len(r["improved"]) >= 2 and bool(r["gate_passed"])
    return r


# (label, interference, terse's lr_scale, every domain in every step): the naive sum, the same with both
# domains in every step (PCGrad's sampling, without its projection: the control), per-domain optimizers,
# the same with the louder domain's learning rate cut, and PCGrad; same start, steps and seed
VARIANTS = (("sum", "sum", 1.0, False), ("sum, every domain per step", "sum", 1.0, True),
            ("weights", "weights", 1.0, False), ("weights, terse lr x0.25", "weights", 0.25, False),
            ("pcgrad", "pcgrad", 1.0, True))


def same_prompt_domains(out_dir: Path) -> tuple[dict, dict]:
    """terse and verbose over the SAME prompts, no style asked for: the rewards alone disagree."""
    from mainspring.train.domains.facts import FACTS

    data = out_dir / "facts.jsonl"
    data.parent.mkdir(parents=True, exist_ok=True)
    data.write_text("\n".join(json.dumps({"id": f"f{i}", "prompt": q, "question": q, "answers": list(a)})
                              for i, (q, a) in enumerate(FACTS)) + "\n")
    scorer = "mainspring.train.domains.answer_style:score_"
    return ({"name": "terse", "data": str(data), "scorer": scorer + "terse", "max_tokens": 16, "temperature": 1.0},
            {"name": "verbose", "data": str(data), "scorer": scorer + "verbose", "max_tokens": 48,
             "temperature": 1.0})


def conflict(out_dir: Path, same_prompts: bool) -> dict:
    terse, verbose = yaml.safe_load((CONFIGS / "conflict.yaml").read_text())["domains"]  # the mix's weights
    if same_prompts:
        same = same_prompt_domains(out_dir)
        terse, verbose = {**same[0], **terse}, {**same[1], **verbose}
    out = {}
    for i, (label, mode, scale, cover) in enumerate(VARIANTS):
        print(f"conflicting-domains demo ({'same' if same_prompts else 'similar'} prompts): {label}", file=sys.stderr)
        overrides = {"interference": mode, "every_domain_per_step": cover,
                     "domains": [{**terse, "lr_scale": scale}, verbose]}
        out[label] = run(CONFIGS / "conflict.yaml", overrides, out_dir / f"conflict-{int(same_prompts)}-{i}")
    return out


def markdown(report: dict) -> str:
    lines = []
    demo = report.get("multi_domain")
    if demo:
        lines += [f"Multi-domain run ({demo['steps']} steps, {demo['seconds'] / 60:.1f} min, "
                  f"{demo.get('cpu', report['cpu'])}): "
                  f"gate {'green' if demo['gate_passed'] else 'RED'}; improved with a CI excluding zero: "
                  f"{', '.join(demo['improved']) or 'none'}.", "",
                  "| domain | before | after | delta | 95% CI | n |", "|---|---|---|---|---|---|"]
        for n, c in sorted(demo["changes"].items()):
            lines.append(f"| {n} | {c['before']:.3f} | {c['after']:.3f} | {c['delta']:+.3f} | "
                         f"[{c['ci'][0]:+.3f}, {c['ci'][1]:+.3f}] | {c['n']} |")
    for key, title in (("conflict", "similar prompts: the instruction differs, \"Answer in one word.\" vs "
                                     "\"Answer in a full sentence.\""),
                       ("conflict_same", "the same prompts, no style asked: only the rewards disagree")):
        conf = report.get(key)
        if not conf:
            continue
        cfg = next(iter(conf.values()))["config"]
        mix = ":".join(f"{d['name']} {d.get('sampling_weight', 1)}" for d in cfg["domains"])
        where = next(iter(conf.values())).get("cpu", report["cpu"])
        lines += ["", f"Conflicting domains, terse vs verbose, {title}; mix {mix}, {cfg['steps']} steps, lr "
                      f"{cfg['lr']}, {where} (same start, steps and seed; delta [95% CI]):", "",
                  "| interference | terse delta | verbose delta | gate |", "|---|---|---|---|"]
        for mode, r in conf.items():
            ch = r["changes"]

            def cell(name: str) -> str:
                c = ch.get(name)  # noqa: B023 (cell is called within this iteration only)
                return f"{c['delta']:+.3f} [{c['ci'][0]:+.3f}, {c['ci'][1]:+.3f}]" if c else "-"
            lines.append(f"| {mode} | {cell('terse')} | {cell('verbose')} | "
                         f"{'green' if r['gate_passed'] else 'red'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    from train import cpu_model

    ap = argparse.ArgumentParser()
    ap.add_argument("--only", choices=["multi", "conflict", "conflict_same"])
    ap.add_argument("--runs", default=str(Path(os.environ.get("TMPDIR", "/tmp")) / "mainspring-train-demo"))
    ap.add_argument("--out", default=str(RESULTS / "train_demo.json"))
    ap.add_argument("--update-readme", action="store_true")
    args, _ = ap.parse_known_args(argv)
    runs = Path(args.runs)
    out = Path(args.out)
    report = json.loads(out.read_text()) if out.exists() else {}
    report.update(cpu=cpu_model(), load_before=os.getloadavg()[0])
    if args.only in (None, "multi"):
        report["multi_domain"] = multi_domain(runs)
    if args.only in (None, "conflict"):
        report["conflict"] = conflict(runs, same_prompts=False)
    if args.only == "conflict_same":  # the extra setting: not part of the default demo
        report["conflict_same"] = conflict(runs, same_prompts=True)
    report["load_after"] = os.getloadavg()[0]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(markdown(report))
    if args.update_readme:
        from readme_table import write_table

        write_table("train_demo", out, markdown)

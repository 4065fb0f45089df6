"""The run report: report.md with PNG plots (per-domain reward curves, held-out eval before/after
with confidence intervals, completion length), read from the run folder's metrics and eval files."""

from __future__ import annotations

import json
from pathlib import Path


def _load(run_dir: Path) -> tuple[list[dict], dict | None, dict | None, dict | None]:
    metrics_file = run_dir / "metrics.jsonl"
    metrics = [json.loads(ln) for ln in metrics_file.read_text().splitlines() if ln] if metrics_file.exists() else []

    def opt(name: str):
        p = run_dir / name
        return json.loads(p.read_text()) if p.exists() else None

    return metrics, opt("eval_before.json"), opt("eval_after.json"), opt("changes.json")


def _smooth(values: list[float], k: int = 3) -> list[float]:
    out = []
    for i in range(len(values)):
        window = values[max(0, i - k + 1):i + 1]
        out.append(sum(window) / len(window))
    return out


def plot(run_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics, before, after, _ = _load(run_dir)
    made = []
    if metrics:
        fig, ax = plt.subplots(figsize=(7, 4))
        domains = sorted({k[7:] for m in metrics for k in m if k.startswith("reward_")})
        for d in domains:
            pts = [(m["step"], m[f"reward_{d}"]) for m in metrics if f"reward_{d}" in m]
            ax.plot([p[0] for p in pts], _smooth([p[1] for p in pts]), label=d)
        ax.set(xlabel="step", ylabel="training reward (mean of 3 steps)", title="Reward per domain", ylim=(-0.02, 1.02))
        ax.legend(fontsize=8)
        fig.tight_layout()
        made.append(run_dir / "reward.png")
        fig.savefig(made[-1], dpi=110)
        plt.close(fig)
        fig, ax = plt.subplots(figsize=(7, 3))
        ax.plot([m["step"] for m in metrics], [m["completion_len"] for m in metrics])
        ax.set(xlabel="step", ylabel="tokens", title="Mean completion length")
        fig.tight_layout()
        made.append(run_dir / "length.png")
        fig.savefig(made[-1], dpi=110)
        plt.close(fig)
    if before and after:
        names = sorted(before)
        fig, ax = plt.subplots(figsize=(7, 4))
        x = range(len(names))
        for off, data, label in ((-0.2, before, "before"), (0.2, after, "after")):
            means = [data[n]["mean"] for n in names]
            err = [[m - data[n]["ci"][0] for n, m in zip(names, means)],
                   [data[n]["ci"][1] - m for n, m in zip(names, means)]]
            ax.bar([i + off for i in x], means, 0.4, yerr=err, capsize=3, label=label)
        ax.set_xticks(list(x), names)
        ax.set(ylabel="held-out score (greedy)", title="Eval before / after (95% CI)", ylim=(0, 1.05))
        ax.legend()
        fig.tight_layout()
        made.append(run_dir / "eval.png")
        fig.savefig(made[-1], dpi=110)
        plt.close(fig)
    return made


def write_report(run_dir: Path) -> Path:
    run_dir = Path(run_dir)
    metrics, before, after, changes = _load(run_dir)
    pngs = plot(run_dir)
    lines = [f"# Training report: {run_dir.name}", ""]
    if metrics:
        last = metrics[-1]
        step_s = sorted(m["step_s"] for m in metrics)[len(metrics) // 2]
        errors = sum(m.get("scorer_errors", 0) for m in metrics)
        lines += [f"{len(metrics)} steps; median step {step_s:.1f} s; rollout {last['rollout_tokens_per_s']:.1f} tok/s "
                  f"(last step); weight sync {last['sync_s'] * 1000:.0f} ms; scorer failures {errors} (scored 0).", ""]
        if errors:
            examples = {e for m in metrics for e in m.get("scorer_error_examples", [])}
            lines += ["Scorer failures, examples: " + "; ".join(sorted(examples)[:3]), ""]
    if changes:
        lines += ["| domain | before | after | delta | 95% CI (paired bootstrap) | n |", "|---|---|---|---|---|---|"]
        for n, c in sorted(changes.items()):
            mark = " *" if c["significant"] else ""
            lines.append(f"| {n} | {c['before']:.3f} | {c['after']:.3f} | {c['delta']:+.3f}{mark} | "
                         f"[{c['ci'][0]:+.3f}, {c['ci'][1]:+.3f}] | {c['n']} |")
        lines += ["", "\\* the interval excludes zero.", ""]
    elif before:
        lines += ["| domain | held-out before |", "|---|---|"]
        lines += [f"| {n} | {e['mean']:.3f} |" for n, e in sorted(before.items())] + [""]
    lines += [f"![{p.stem}]({p.name})" for p in pngs]
    out = run_dir / "report.md"
    out.write_text("\n".join(lines) + "\n")
    return out

"""The inspection report: report.md (a summary table per domain and severity, then every finding
with its item ids, evidence and fix), PNG plots of what the evidence measured, and findings.json
(every finding in full, for CI and scripts).

Plots are drawn from evidence when it is there and skipped when it is not, so a check that records
fewer numbers (or a new check) never breaks the report:
- pass-rate histogram per domain: `pass_rates` (list, or {item id: rate}), or `histogram`
  ({"bins": [rate, ...], "counts": [items, ...]}), of difficulty findings;
- reward vs length per domain: `lengths` with `rewards` (or `points`: [[length, reward], ...]), or
  per-family `rewards` over `levels_words`, of reward-hacking findings and of the model's samples;
- duplicate cluster sizes per domain: `cluster_sizes`, or `clusters` (lists of ids), of data
  findings, else the item count of each duplicate finding (one finding per cluster);
- output lengths per served-output set: `histogram_words` of `outputs.summary`.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Sequence

from mainspring.train.inspect.findings import SEVERITIES, Finding
from mainspring.train.inspect.runner import counts

MAX_IDS = 40  # per finding in report.md; findings.json has all of them
_ORDER = {s: i for i, s in enumerate(reversed(SEVERITIES))}  # error first


def write_report(findings: Sequence[Finding], out_dir: str | Path, domains: Iterable[str] = ()) -> Path:
    """Write report.md, findings.json and the plots into `out_dir` (created); returns report.md's path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    names = list(dict.fromkeys([*domains, *(f.domain for f in findings)]))
    table = counts(findings, names)
    (out / "findings.json").write_text(json.dumps(
        {"domains": names, "counts": table, "findings": [f.to_json() for f in findings]}, indent=2, default=str))
    plots = plot(findings, out)
    lines = ["# Environment inspection", "",
             f"{len(findings)} findings over {len(names)} domains, "
             f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC. "
             "Errors make training wrong; warnings are suspicious; info are measurements.", "",
             "| domain | " + " | ".join(SEVERITIES[::-1]) + " |", "|---|" + "---|" * len(SEVERITIES)]
    lines += [f"| {_cell(d)} | " + " | ".join(str(c[s]) for s in SEVERITIES[::-1]) + " |" for d, c in table.items()]
    if plots:
        lines += ["", "## Plots", ""] + [f"![{p.stem}]({p.name})" for p in plots]
    by_domain: dict[str, list[Finding]] = defaultdict(list)
    for f in findings:
        by_domain[f.domain].append(f)
    lines += ["", "## Findings"]
    for d in names:
        lines += ["", f"### {d}", ""]
        if not by_domain[d]:
            lines.append("No findings.")
        for f in sorted(by_domain[d], key=lambda f: _ORDER[f.severity]):
            lines += _finding(f)
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def _finding(f: Finding) -> list[str]:
    lines = [f"- **{f.severity.upper()}** `{f.check}`: {_one_line(f.message)}"]
    if f.item_ids:
        shown = ", ".join(f"`{i}`" for i in f.item_ids[:MAX_IDS])
        more = f" and {len(f.item_ids) - MAX_IDS} more (findings.json)" if len(f.item_ids) > MAX_IDS else ""
        lines.append(f"  - items ({len(f.item_ids)}): {shown}{more}")
    if f.evidence:
        lines.append(f"  - evidence: `{_one_line(json.dumps(_short(f.evidence), default=str))}`")
    if f.fix:
        lines.append(f"  - fix: {_one_line(f.fix)}")
    return lines


def _short(value: Any, depth: int = 0) -> Any:
    """Evidence small enough for one Markdown line: long lists and strings cut, the rest as is."""
    if isinstance(value, dict):
        return {k: _short(v, depth + 1) for k, v in list(value.items())[:12]}
    if isinstance(value, (list, tuple)):
        head = [_short(v, depth + 1) for v in value[:8]]
        return head + [f"... {len(value) - 8} more"] if len(value) > 8 else head
    if isinstance(value, str) and len(value) > 160:
        return value[:157] + "..."
    if isinstance(value, float):
        return round(value, 4)
    return value


def _one_line(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def _cell(text: str) -> str:
    return _one_line(text).replace("|", "\\|")


# ---------------------------------------------------------------------------------------------- plots

def _floats(value: Any) -> list[float]:
    """The numbers of a list or a {key: number} mapping; [] for anything else."""
    if isinstance(value, dict):
        value = list(value.values())
    if not isinstance(value, (list, tuple)):
        return []
    return [float(v) for v in value if isinstance(v, (int, float)) and not isinstance(v, bool)]


def pass_rates(findings: Iterable[Finding]) -> dict[str, list[float]]:
    """Per domain, the item pass rates difficulty findings recorded (the first finding that has them)."""
    out: dict[str, list[float]] = {}
    for f in findings:
        if f.check.startswith("difficulty.") and f.domain not in out:
            rates = _floats(f.evidence.get("pass_rates"))
            hist = f.evidence.get("histogram")
            if not rates and isinstance(hist, dict):  # exact bins: k of G solved -> items
                bins, n = _floats(hist.get("bins")), _floats(hist.get("counts"))
                rates = [b for b, c in zip(bins, n) for _ in range(int(c))] if len(bins) == len(n) else []
            if rates:
                out[f.domain] = rates
    return out


Series = tuple[str, list[float], list[float]]  # (label, lengths, rewards)


def reward_length(findings: Iterable[Finding]) -> dict[str, list[Series]]:
    """Per domain, the reward-vs-length series that reward-hacking findings and the model samples'
    `difficulty.reward_length` recorded: `lengths` with `rewards` (or `points`), or per probe family
    `families: {name: {"rewards": [...]}}` over `levels_words` (mean reward at each padded length)."""
    out: dict[str, list[Series]] = {}
    for f in findings:
        if not (f.check.startswith("hacking.") or f.check == "difficulty.reward_length"):
            continue
        ev = f.evidence
        series: list[Series] = []
        lengths, rewards = _floats(ev.get("lengths")), _floats(ev.get("rewards"))
        if not (lengths and len(lengths) == len(rewards)) and isinstance(ev.get("points"), list):
            pairs = [_floats(p) for p in ev["points"] if isinstance(p, (list, tuple))]
            lengths, rewards = [p[0] for p in pairs if len(p) == 2], [p[1] for p in pairs if len(p) == 2]
        if lengths and len(lengths) == len(rewards):
            series.append(("completions", lengths, rewards))
        levels, families = _floats(ev.get("levels_words")), ev.get("families")
        if levels and isinstance(families, dict):
            for name, fam in families.items():
                ys = _floats(fam.get("rewards", fam.get("mean_rewards"))) if isinstance(fam, dict) else []
                if len(ys) == len(levels):
                    series.append((str(name), levels, ys))
        if series:
            out.setdefault(f.domain, []).extend(series)
    return out


def cluster_sizes(findings: Iterable[Finding]) -> dict[str, list[int]]:
    """Per domain, the sizes of the duplicate clusters data findings recorded."""
    out: dict[str, list[int]] = defaultdict(list)
    for f in findings:
        if not f.check.startswith("data.") or "dup" not in f.check:
            continue
        ev = f.evidence
        if _floats(ev.get("cluster_sizes")):
            out[f.domain] += [int(v) for v in _floats(ev["cluster_sizes"])]
        elif isinstance(ev.get("clusters"), list):
            out[f.domain] += [len(c) for c in ev["clusters"] if isinstance(c, (list, tuple))]
        elif len(f.item_ids) > 1:
            out[f.domain].append(len(f.item_ids))
    return {d: sizes for d, sizes in out.items() if sizes}


def output_lengths(findings: Iterable[Finding]) -> dict[str, tuple[list[float], list[float]]]:
    """Per served-output set, the word-length histogram (`histogram_words`: edges, counts) of its summary."""
    out: dict[str, tuple[list[float], list[float]]] = {}
    for f in findings:
        hist = f.evidence.get("histogram_words") if f.check == "outputs.summary" else None
        if isinstance(hist, dict):
            edges, n = _floats(hist.get("edges")), _floats(hist.get("counts"))
            if n and len(edges) == len(n) + 1 and sum(n) > 0:
                out[f.domain] = (edges, n)
    return out


def plot(findings: Sequence[Finding], out_dir: Path) -> list[Path]:
    """The PNGs the evidence allows, written into `out_dir`."""
    rates, rl, clusters = pass_rates(findings), reward_length(findings), cluster_sizes(findings)
    served = output_lengths(findings)
    if not (rates or rl or clusters or served):
        return []  # matplotlib is not even imported for a report without numbers to draw
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on a server or in CI
    import matplotlib.pyplot as plt

    made: list[Path] = []

    def save(fig: Any, name: str) -> None:
        made.append(out_dir / name)
        fig.tight_layout()
        fig.savefig(made[-1], dpi=100)
        plt.close(fig)

    if rates:
        fig, axes = plt.subplots(1, len(rates), figsize=(3.2 * len(rates), 2.8), squeeze=False)
        for ax, (d, values) in zip(axes[0], rates.items()):
            ax.hist(values, bins=[i / 10 for i in range(11)], color="#4477aa", edgecolor="white")
            ax.set(title=d, xlabel="pass rate", ylabel="items", xlim=(0, 1))
        save(fig, "pass_rates.png")
    if rl:
        fig, axes = plt.subplots(1, len(rl), figsize=(3.2 * len(rl), 2.8), squeeze=False)
        for ax, (d, series) in zip(axes[0], rl.items()):
            for label, lengths, rewards in series:
                if label == "completions":
                    ax.scatter(lengths, rewards, s=8, alpha=0.6, label=label)
                else:
                    ax.plot(lengths, rewards, marker="o", markersize=3, label=label)
            ax.set(title=d, xlabel="completion length", ylabel="reward", ylim=(-0.05, 1.05))
            if len(series) > 1:
                ax.legend(fontsize=6)
        save(fig, "reward_vs_length.png")
    if clusters:
        fig, axes = plt.subplots(1, len(clusters), figsize=(3.2 * len(clusters), 2.8), squeeze=False)
        for ax, (d, sizes) in zip(axes[0], clusters.items()):
            ax.hist(sizes, bins=range(2, max(sizes) + 2), color="#228833", edgecolor="white", align="left")
            ax.set(title=d, xlabel="duplicate cluster size", ylabel="clusters")
        save(fig, "duplicate_clusters.png")
    if served:
        fig, axes = plt.subplots(1, len(served), figsize=(3.2 * len(served), 2.8), squeeze=False)
        for ax, (d, (edges, n)) in zip(axes[0], served.items()):
            ax.stairs(n, edges, fill=True, color="#aa3377")
            ax.set(title=d, xlabel="output length (words)", ylabel="outputs")
        save(fig, "output_lengths.png")
    return made

"""`mainspring inspect DOMAIN|CONFIG [--samples G] [--max-items N] [--json] [--out DIR] [--no-model]`,
and the gate `mainspring train` runs before training (`gate_training`).

DOMAIN is a shipped domain's name or a comma list of them; CONFIG is a train config file, whose
domains (and mixed data) are loaded exactly as `mainspring train` loads them. Exit codes: 0 no
error finding, 1 an error finding (training on it would be wrong), 2 bad input.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Sequence

import typer
from rich.console import Console

from mainspring.console import fail
from mainspring.train.inspect.findings import SEVERITIES, CompletionSource, Finding, InspectOptions

if TYPE_CHECKING:
    from mainspring.train.config import TrainConfig
    from mainspring.train.domains.base import Domain

SUMMARY_ROWS = 20  # findings listed under the table; the report has all of them
CONFIG_SUFFIXES = (".yaml", ".yml", ".json")


@dataclasses.dataclass
class Target:
    label: str  # names the default report folder
    domains: dict[str, Domain]
    model: str


def load_target(target: str, seed: int = 0) -> Target:
    """The domains `target` names (a config file, or shipped names); TrainConfigError or DomainError
    for bad input."""
    from mainspring.train.config import DomainSpec, TrainConfig
    from mainspring.train.domains.base import DomainError
    from mainspring.train.domains.registry import builtin_names, load_domains

    path = Path(target)
    if path.suffix.lower() in CONFIG_SUFFIXES or path.is_file():
        cfg = TrainConfig.load(path)
        return Target(path.stem, config_domains(cfg), cfg.model)
    names = [n.strip() for n in target.split(",")]
    unknown = [n for n in names if n not in builtin_names()]
    if unknown or not names:
        raise DomainError(f"unknown domain {', '.join(map(repr, unknown)) or repr(target)}: shipped domains are "
                          f"{', '.join(builtin_names())}; a domain of your own goes in a train config")
    return Target("_".join(names), load_domains([DomainSpec(name=n) for n in names], seed), "smollm2")


def config_domains(cfg: TrainConfig, domains: dict[str, Domain] | None = None) -> dict[str, Domain]:
    """The domains a run of `cfg` trains on, mixed data routed in. `domains` (already loaded) are
    copied, not changed: the trainer routes the mixed data into them itself."""
    from mainspring.train.domains.registry import load_domains

    domains = domains if domains is not None else load_domains(cfg.domains, cfg.seed)
    if not cfg.mixed_data:
        return domains
    from mainspring.train.mixed import add_mixed

    copies = {n: dataclasses.replace(d, train=list(d.train), eval=list(d.eval)) for n, d in domains.items()}
    add_mixed(cfg.mixed_data, copies, cfg.seed)
    return copies


def model_source(model: str, seed: int = 0) -> CompletionSource:
    """The current model's completions for the model checks: the embedded engine over `model`,
    sampled as training samples (difficulty.engine_source). EngineError when it cannot load."""
    from mainspring.train.inspect.difficulty import engine_source

    return engine_source(model, seed=seed)


def render_summary(findings: Sequence[Finding], domains: Sequence[str], console: Console) -> None:
    """The table per domain and severity, then the errors and warnings, one line each. A terminal
    gets a rich table; a pipe or a log gets plain, unwrapped lines a script can read."""
    from rich.table import Table

    from mainspring.train.inspect.runner import counts

    table = counts(findings, domains)
    worst = sorted((f for f in findings if f.severity != "info"), key=lambda f: f.severity != "error")
    if console.is_terminal:
        t = Table(title="inspection", show_edge=False)
        t.add_column("domain")
        style = {"error": "red", "warning": "yellow", "info": "dim"}
        for s in SEVERITIES[::-1]:
            t.add_column(s, justify="right", style=style[s])
        for d, c in table.items():
            t.add_row(d, *(str(c[s]) for s in SEVERITIES[::-1]))
        console.print(t)
        for f in worst[:SUMMARY_ROWS]:
            console.print(f"[{style[f.severity]}]{f.severity}[/] {f.domain} {f.check}: {_line(f)}",
                          markup=True, highlight=False)
    else:
        width = max([len("domain"), *map(len, table)])
        lines = ["domain".ljust(width) + "".join(f"  {s:>7}" for s in SEVERITIES[::-1])]
        lines += [d.ljust(width) + "".join(f"  {c[s]:>7}" for s in SEVERITIES[::-1]) for d, c in table.items()]
        lines += [f"{f.severity} {f.domain} {f.check}: {_line(f)}" for f in worst[:SUMMARY_ROWS]]
        console.out("\n".join(lines), highlight=False)
    if len(worst) > SUMMARY_ROWS:
        console.out(f"... and {len(worst) - SUMMARY_ROWS} more errors and warnings in the report",
                    highlight=False)


def _line(f: Finding) -> str:
    ids = f.item_ids[:3]
    more = f" +{len(f.item_ids) - 3}" if len(f.item_ids) > 3 else ""
    items = f" [{', '.join(ids)}{more}]" if ids else ""
    return " ".join(f.message.split()) + items


def inspect_cmd(
    target: str = typer.Argument(..., help="a shipped domain (json, math, ...), a comma list of them, or a train "
                                           "config file (YAML)"),
    samples: int = typer.Option(8, "--samples", "-g", min=1, help="G: completions per item for the model checks"),
    max_items: Optional[int] = typer.Option(None, "--max-items", "-n", min=1, help="items per split (default all)"),
    as_json: bool = typer.Option(False, "--json", help="print the findings as one JSON object on stdout"),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="report folder; default <data dir>/inspect/<name>"),
    no_model: bool = typer.Option(False, "--no-model", help="skip the checks that sample the model"),
    model: Optional[str] = typer.Option(None, "--model", help="model for the model checks (default: the config's)"),
    seed: int = typer.Option(0, "--seed", help="seed of the shipped domains' train split"),
) -> None:
    """Inspect training domains: verifier soundness, reward hacking, duplicates, leaks, malformed
    items and (with the model) difficulty; writes a report and exits 1 on an error finding."""
    from mainspring.config import get_settings
    from mainspring.engine.errors import EngineError
    from mainspring.train.config import TrainConfigError
    from mainspring.train.domains.base import DomainError
    from mainspring.train.inspect.report import write_report
    from mainspring.train.inspect.runner import counts, has_errors, inspect_domains

    try:
        t = load_target(target, seed)
    except (TrainConfigError, DomainError) as exc:
        fail(str(exc))
    source = None
    if not no_model:
        try:
            source = model_source(model or t.model, seed)
        except EngineError as exc:
            fail(f"cannot load the model for the model checks ({exc}); pass --no-model to skip them")
    findings = inspect_domains(t.domains, InspectOptions(samples=samples, max_items=max_items, seed=seed), source)
    names = list(t.domains)
    report = write_report(findings, out or get_settings().data_dir / "inspect" / t.label, names)
    if as_json:
        typer.echo(json.dumps({"target": target, "domains": names, "model_checks": source is not None,
                               "counts": counts(findings, names), "errors": sum(f.severity == "error" for f in findings),
                               "report": str(report), "findings": [f.to_json() for f in findings]}, default=str))
    else:
        console = Console(soft_wrap=True)
        render_summary(findings, names, console)
        if source is None:
            console.out("model checks skipped (--no-model)", highlight=False)
        console.out(f"report: {report}", highlight=False)
    if has_errors(findings):
        raise typer.Exit(1)


def gate_training(cfg: TrainConfig, run_dir: Path, *, quiet: bool = False) -> dict[str, Domain]:
    """The model-free inspection `mainspring train` runs first: the loaded domains when no finding is
    an error (the trainer reuses them); otherwise the summary on stderr and exit code 1. Bad domains
    exit 2. The report goes to <run dir>/inspect."""
    from mainspring.train.domains.base import DomainError
    from mainspring.train.domains.registry import load_domains
    from mainspring.train.inspect.report import write_report
    from mainspring.train.inspect.runner import has_errors, inspect_domains

    err = Console(stderr=True, soft_wrap=True)
    try:
        domains = load_domains(cfg.domains, cfg.seed)
        inspected = config_domains(cfg, domains)
    except DomainError as exc:
        fail(str(exc))
    findings = inspect_domains(inspected, InspectOptions(seed=cfg.seed), progress=not quiet)
    if quiet:  # the other ranks of a distributed run: same findings, same decision, one report
        if has_errors(findings):
            raise typer.Exit(1)
        return domains
    report = write_report(findings, run_dir / "inspect", list(inspected))
    if has_errors(findings):
        render_summary(findings, list(inspected), err)
        fail(f"inspection found errors, training not started (report: {report}; "
             "fix them, or pass --no-inspect to train anyway)", code=1)
    warnings = sum(f.severity == "warning" for f in findings)
    err.out(f"inspection: no errors, {warnings} warnings (report: {report})", highlight=False)
    return domains

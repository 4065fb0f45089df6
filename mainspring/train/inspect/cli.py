"""`mainspring inspect DOMAIN|CONFIG [--samples G] [--max-items N] [--json] [--out DIR] [--no-model]`,
the gate `mainspring train` runs before training (`gate_training`), and
`mainspring inspect-outputs BATCH_OUTPUT|--agent-runs`, the same report over what the platform served.

DOMAIN is a shipped domain's name or a comma list of them; CONFIG is a train config file, whose
domains (and mixed data) are loaded exactly as `mainspring train` loads them. Exit codes: 0 no
error finding, 1 an error finding (training on it would be wrong), 2 bad input; inspect-outputs exits 1 on a finding
at or above --fail-on (default error; served-output findings are warnings, so `--fail-on warning`
makes it a CI gate).
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
    check_timeout: Optional[float] = typer.Option(None, "--check-timeout", min=0.001,
                                                  help="seconds one check may take (an error finding past it)"),
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
    findings = inspect_domains(t.domains, InspectOptions(samples=samples, max_items=max_items, seed=seed,
                                                                check_timeout_s=check_timeout), source)
    names = list(t.domains)
    report = write_report(findings, out or get_settings().data_dir / "inspect" / t.label, names)
    if as_json:
        typer.echo(json.dumps({"target": target, "domains": names, "model_checks": source is not None,
                               "counts": counts(findings, names),
                               "errors": sum(f.severity == "error" for f in findings),
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


def inspect_outputs_cmd(
    output_file: Optional[Path] = typer.Argument(None, help="a batch output (or error) JSONL file"),
    input_file: Optional[Path] = typer.Option(None, "--input", "-i",
                                              help="the batch's input JSONL: each request's response_format"),
    agent_runs: bool = typer.Option(False, "--agent-runs", help="the agent journal's model steps instead"),
    project: Optional[str] = typer.Option(None, "--project", "-p", help="with --agent-runs: only this project's runs"),
    run_ids: Optional[list[str]] = typer.Option(None, "--run", help="with --agent-runs: only this run (repeatable)"),
    limit: Optional[int] = typer.Option(None, "--limit", "-n", min=1, help="with --agent-runs: the oldest N steps"),
    fail_on: str = typer.Option("error", "--fail-on", help="exit 1 on a finding of this severity or worse: "
                                                           "error or warning"),
    as_json: bool = typer.Option(False, "--json", help="print the findings as one JSON object on stdout"),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="report folder; default <data dir>/inspect/<name>"),
) -> None:
    """Check served outputs: schema validity, refusals, truncation, empty answers and failures of a
    batch output file or of recorded agent runs; writes the same report as `mainspring inspect`."""
    from mainspring.config import get_settings
    from mainspring.train.inspect.outputs import check_outputs, records_from_agent_runs, records_from_batch
    from mainspring.train.inspect.report import write_report
    from mainspring.train.inspect.runner import counts

    if fail_on not in ("error", "warning"):
        fail(f"--fail-on must be error or warning, not {fail_on!r}")
    if agent_runs == (output_file is not None):
        fail("name a batch output file or pass --agent-runs (one of them)")
    if not agent_runs and (project or run_ids or limit):
        fail("--project, --run and --limit select agent runs: pass --agent-runs")
    if agent_runs and input_file is not None:
        fail("--input belongs to a batch output file, not to --agent-runs")
    settings = get_settings()
    try:
        if output_file is not None:
            for f in (output_file, input_file):
                if f is not None and not f.is_file():
                    fail(f"no such file: {f}")
            name = output_file.stem
            records = records_from_batch(output_file, input_file)
        else:
            name = f"agents-{project}" if project else "agents"
            records = records_from_agent_runs(settings.resolved_database_url(), run_ids=run_ids, project=project,
                                              limit=limit)
    except (ValueError, OSError, UnicodeDecodeError) as exc:
        fail(str(exc))
    findings = check_outputs(records, name=name)
    report = write_report(findings, out or settings.data_dir / "inspect" / f"outputs-{name}", [name])
    worst = {"error": ("error",), "warning": ("error", "warning")}[fail_on]
    if as_json:
        typer.echo(json.dumps({"source": str(output_file) if output_file else "agent-runs", "name": name,
                               "records": len(records), "counts": counts(findings, [name]), "report": str(report),
                               "findings": [f.to_json() for f in findings]}, default=str))
    else:
        console = Console(soft_wrap=True)
        render_summary(findings, [name], console)
        console.out(f"report: {report}", highlight=False)
    if any(f.severity in worst for f in findings):
        raise typer.Exit(1)

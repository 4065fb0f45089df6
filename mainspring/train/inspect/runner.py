"""Run the inspection checks over domains: every model-free check, and the model checks when a
`CompletionSource` is given. A check that raises becomes an error finding, never a crash, so one
broken check (or one broken domain) never hides what the others found.

The checks are found by name (module + function under this package) and imported when a run needs
them: the check modules import `findings`, which imports this package, so a top-level import here
would be circular; and a missing module is reported as a finding instead of breaking the command.
"""

from __future__ import annotations

import importlib
import threading
import traceback
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, Sequence

from mainspring.train.domains.base import Domain
from mainspring.train.inspect.findings import SEVERITIES, CompletionSource, Finding, InspectOptions, Severity

CheckFn = Callable[..., list[Finding]]


@dataclass(frozen=True)
class Check:
    """One check: `fn(domain, options)`, or `fn(domain, options, source)` when `needs_model`."""

    name: str  # "data.check_duplicates": what a failure or the progress bar calls it
    fn: CheckFn
    needs_model: bool = False


# (module under mainspring.train.inspect, function, needs a CompletionSource). Malformed data first:
# when the data is broken, its finding is the one that explains the failures of the checks after it.
BUILTIN: tuple[tuple[str, str, bool], ...] = (
    ("data", "check_malformed", False),
    ("verifier", "check_verifier", False),
    ("hacking", "check_reward_hacking", False),
    ("data", "check_duplicates", False),
    ("data", "check_leakage", False),
    ("difficulty", "check_difficulty", True),
    ("difficulty", "check_label_noise", True),
)


def builtin_checks(*, model: bool = True) -> tuple[list[Check], list[Finding]]:
    """The shipped checks that import, and a warning finding for each that does not (a package
    installed without one of its modules still inspects with the rest)."""
    found: list[Check] = []
    missing: list[Finding] = []
    for module, function, needs_model in BUILTIN:
        if needs_model and not model:
            continue
        name = f"{module}.{function}"
        try:
            fn = getattr(importlib.import_module(f"mainspring.train.inspect.{module}"), function)
        except (ImportError, AttributeError) as exc:
            missing.append(Finding("runner.unavailable", "warning", "*", f"check {name} is unavailable: {exc}",
                                   evidence={"check": name}, fix="reinstall mainspring; the check was not run"))
            continue
        found.append(Check(name, fn, needs_model))
    return found, missing


def inspect_domain(domain: Domain, options: InspectOptions | None = None, source: CompletionSource | None = None,
                   checks: Sequence[Check] | None = None, *, on_check: Callable[[str], None] | None = None
                   ) -> list[Finding]:
    """Every finding of `checks` (default: the shipped ones) on `domain`; the model checks run only
    when `source` is given. `on_check(name)` is called after each check (the progress bar)."""
    options = options or InspectOptions()
    extra: list[Finding] = []
    if checks is None:
        checks, missing = builtin_checks(model=source is not None)
        extra = [_for_domain(f, domain.name) for f in missing]
    out: list[Finding] = []
    for check in checks:
        if check.needs_model and source is None:
            continue
        out.extend(run_check(check, domain, options, source))
        if on_check is not None:
            on_check(check.name)
    return out + extra


def run_check(check: Check, domain: Domain, options: InspectOptions, source: CompletionSource | None = None
              ) -> list[Finding]:
    """One check's findings; its exception, a result that is not a list of findings, or (with
    `options.check_timeout_s`) running past the limit, is one error finding that names the check
    (the domain cannot be trusted when a check could not look at it)."""
    def call() -> object:
        return check.fn(domain, options, source) if check.needs_model else check.fn(domain, options)

    try:
        result = call() if options.check_timeout_s is None else _within(call, options.check_timeout_s)
    except _CheckTimeout:
        return [Finding("runner.check_timeout", "error", domain.name,
                        f"check {check.name} did not finish in {options.check_timeout_s:g} s",
                        evidence={"check": check.name, "timeout_s": options.check_timeout_s},
                        fix="inspect fewer items (--max-items), raise --check-timeout, or find what hangs "
                            "(a scorer that ignores its own timeout)")]
    except Exception as exc:  # any bug or bad data inside a check: reported, the run goes on
        tail = traceback.format_exc(limit=-3).strip().splitlines()[-6:]
        return [Finding("runner.check_failed", "error", domain.name,
                        f"check {check.name} failed: {type(exc).__name__}: {exc}",
                        evidence={"check": check.name, "traceback": "\n".join(tail)},
                        fix="fix the data or scorer the traceback points at, or report the check's bug")]
    if not isinstance(result, list) or not all(isinstance(f, Finding) for f in result):
        return [Finding("runner.check_failed", "error", domain.name,
                        f"check {check.name} failed: it returned {type(result).__name__}, not a list of findings",
                        evidence={"check": check.name}, fix="report the check's bug")]
    return result


class _CheckTimeout(Exception):
    pass


def _within(fn: Callable[[], object], timeout_s: float) -> object:
    """fn() in a daemon thread, or _CheckTimeout after `timeout_s`. Python cannot kill a thread: a
    check past its limit runs on, abandoned, until it returns or the process exits."""
    box: dict[str, object] = {}

    def target() -> None:
        try:
            box["result"] = fn()
        except BaseException as exc:  # handed to the caller's thread, which reports it
            box["error"] = exc

    worker = threading.Thread(target=target, name="inspect-check", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        raise _CheckTimeout()
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["result"]


def inspect_domains(domains: Mapping[str, Domain] | Iterable[Domain], options: InspectOptions | None = None,
                    source: CompletionSource | None = None, checks: Sequence[Check] | None = None, *,
                    progress: bool = True) -> list[Finding]:
    """`inspect_domain` over several domains, in order, with a progress bar on stderr when it is a
    terminal (`progress=False`: never)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    listed = list(domains.values()) if isinstance(domains, Mapping) else list(domains)
    options = options or InspectOptions()
    missing: list[Finding] = []
    if checks is None:
        checks, missing = builtin_checks(model=source is not None)
    runnable = [c for c in checks if source is not None or not c.needs_model]
    console = Console(stderr=True)
    out: list[Finding] = []
    # a bar in a log or a pipe is noise: only a person at a terminal sees it
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True, disable=not (progress and console.is_terminal)) as bar:
        task = bar.add_task("inspecting", total=len(listed) * len(runnable))
        for domain in listed:
            bar.update(task, description=f"inspecting {domain.name}")
            out.extend(inspect_domain(domain, options, source, runnable,
                                      on_check=lambda name: bar.advance(task)))
            out.extend(_for_domain(f, domain.name) for f in missing)
    return out


def has_errors(findings: Iterable[Finding]) -> bool:
    """Whether any finding makes training wrong (the gate of `mainspring train` and CI)."""
    return any(f.severity == "error" for f in findings)


def counts(findings: Iterable[Finding], domains: Iterable[str] = ()) -> dict[str, dict[Severity, int]]:
    """Findings per domain and severity; every name in `domains` appears, with zeros if clean."""
    table: dict[str, dict[Severity, int]] = {d: dict.fromkeys(SEVERITIES, 0) for d in domains}
    for f in findings:
        table.setdefault(f.domain, dict.fromkeys(SEVERITIES, 0))[f.severity] += 1
    return table


def _for_domain(f: Finding, domain: str) -> Finding:
    return Finding(f.check, f.severity, domain, f.message, f.item_ids, f.evidence, f.fix)

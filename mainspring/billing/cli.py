"""`mainspring keys create|list|revoke` and `mainspring usage`, wired in by mainspring/cli.py:

    app.add_typer(keys_app, name="keys")
    app.command("usage")(usage)

Every command works on Settings' database (migrated on first use). Bad input prints a message and
exits with code 2, never a traceback.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from mainspring.billing import budgets, keys, reports
from mainspring.billing.prices import PriceError, usd_to_micro
from mainspring.console import fail

keys_app = typer.Typer(help="API keys: create (secret shown once), list, revoke.", no_args_is_help=True)
err = Console(stderr=True, soft_wrap=True)  # notes stay on one line for a script or log reading them




def _session(readonly: bool = False):
    from mainspring.store.db import cli_session

    return cli_session(fail, readonly=readonly)


def _table(header: list[str], rows: list[list[str]]) -> None:
    # plain aligned text rather than a rich table: never truncates an id, and pipes cleanly
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    for line in [header, *rows]:
        typer.echo("  ".join(str(c).ljust(w) for c, w in zip(line, widths)).rstrip())


@keys_app.command("create")
def create(
    project: str = typer.Option(..., "--project", "-p", help="project name (a-z, 0-9, _); created if new"),
    name: str = typer.Option("", "--name", "-n", help="a label for the key"),
    budget: Optional[str] = typer.Option(None, "--budget", help="hard spend limit in USD, e.g. 5.00"),
    period: str = typer.Option("total", "--period", help="budget period: total, month or day"),
    rpm: Optional[int] = typer.Option(None, "--rpm", help="requests per minute (0 = unlimited; default: server's)"),
    tpm: Optional[int] = typer.Option(None, "--tpm", help="tokens per minute (0 = unlimited; default: server's)"),
) -> None:
    """Create an API key; its secret is printed once and never stored."""
    limit_u = None
    if budget is not None:
        try:
            limit_u = usd_to_micro(budget)
        except (PriceError, ValueError):
            fail(f"--budget {budget!r} is not an amount in USD >= 0, e.g. 5.00")
    if period not in budgets.PERIODS:
        fail(f"--period {period!r} is not one of {', '.join(budgets.PERIODS)}")
    try:
        with _session() as s:
            made = keys.create_key(s, project, name, rpm_limit=rpm, tpm_limit=tpm)
            if limit_u is not None:
                budgets.set_budget(s, "key", made.key.id, period, limit_u)
    except (keys.KeyAdminError, budgets.BudgetError) as exc:
        fail(str(exc))
    typer.echo(f"key id:  {made.key.id}")
    typer.echo(f"project: {project}")
    if limit_u is not None:
        typer.echo(f"budget:  {budgets.usd(limit_u)} ({period})")
    typer.echo(f"secret:  {made.secret}")
    err.print("store the secret now: it is not shown again", highlight=False)


@keys_app.command("list")
def list_(
    project: Optional[str] = typer.Option(None, "--project", "-p", help="only this project's keys"),
    active: bool = typer.Option(False, "--active", help="hide revoked keys"),
) -> None:
    """List keys (id, project, name, prefix, limits, state); secrets are never shown."""
    with _session(readonly=True) as s:
        found = keys.list_keys(s, project, include_revoked=not active)
    if not found:
        typer.echo("no API keys")
        return
    none = lambda v: "-" if v is None else str(v)  # noqa: E731
    _table(["id", "project", "name", "prefix", "created", "rpm", "tpm", "state"],
           [[k.id, p, k.name or "-", k.prefix + "…", f"{k.created_at:%Y-%m-%d %H:%M}", none(k.rpm_limit),
             none(k.tpm_limit), "revoked" if k.revoked_at else "active"] for k, p in found])


@keys_app.command("revoke")
def revoke(key_id: str = typer.Argument(..., help="the key id, e.g. key_0123456789abcdef")) -> None:
    """Revoke a key: requests with it are refused from now on; its ledger history stays."""
    try:
        with _session() as s:
            k = keys.revoke_key(s, key_id)
    except keys.KeyAdminError as exc:
        fail(str(exc))
    typer.echo(f"revoked {k.id} at {k.revoked_at:%Y-%m-%d %H:%M:%S} UTC")


def _date(flag: str, v: Optional[str]) -> Optional[datetime]:
    if v is None:
        return None
    try:
        return datetime.strptime(v, "%Y-%m-%d").replace(tzinfo=timezone.utc)
    except ValueError:
        fail(f"{flag} {v!r} is not a date like 2025-06-01")


def usage(
    by: str = typer.Option("key", "--by", help="group by: key, project, model, tier or day"),
    since: Optional[str] = typer.Option(None, "--since", help="from this UTC date (YYYY-MM-DD)"),
    until: Optional[str] = typer.Option(None, "--until", help="before this UTC date (YYYY-MM-DD)"),
    csv_file: Optional[Path] = typer.Option(None, "--csv", help="also write the report as CSV to this file"),
) -> None:
    """Usage and cost from the ledger, with cache hit rate and cache savings."""
    if by not in reports.GROUPS:
        fail(f"--by {by!r} is not one of {', '.join(reports.GROUPS)}")
    start, end = _date("--since", since), _date("--until", until)
    with _session(readonly=True) as s:
        rows = reports.usage_report(s, by, start, end)
    if csv_file is not None:
        try:
            reports.write_csv(rows, csv_file, by)
        except OSError as exc:
            fail(f"cannot write {csv_file}: {exc.strerror or exc}")
    if not rows:
        typer.echo("no usage recorded")
        return
    _table([by, "requests", "input", "cached", "hit rate", "output", "cost", "saved by cache"],
           [[r.group, str(r.requests), str(r.input_total), str(r.cache_read), f"{r.cache_hit_rate:.1%}",
             str(r.output), budgets.usd(r.cost_u), budgets.usd(r.savings_u)] for r in rows])


def sim(
    trace: Path = typer.Argument(..., help="JSONL trace (what MAINSPRING_RECORD_TRACE writes)"),
    policy: list[str] = typer.Option([], "--policy", help="cache policy, repeatable: automatic_prefix, "
                                     "explicit_breakpoints, disk_units, kv_blocks (default: all four)"),
    prices: Optional[Path] = typer.Option(None, "--prices", help="price sheet for this server's kv_blocks policy "
                                          "(default: MAINSPRING_PRICES_FILE, else the built-in sheet)"),
    kv_capacity: Optional[int] = typer.Option(None, "--kv-capacity", min=1, help="kv_blocks cache size in tokens"),
    as_json: bool = typer.Option(False, "--json", help="print JSON instead of tables"),
) -> None:
    """Replay a trace under prompt-cache policies: cost by scenario and the advisor's proposals."""
    import json

    from mainspring.billing.advisor import advise
    from mainspring.billing.cache_replay import POLICIES
    from mainspring.billing.cache_replay import policy as make_policy
    from mainspring.billing.prices import load_price_sheet
    from mainspring.billing.simulator import simulate
    from mainspring.billing.trace import TraceError, read_trace
    from mainspring.config import get_settings

    unknown = [p for p in policy if p not in POLICIES]
    if unknown:
        fail(f"--policy {unknown[0]!r} is not one of {', '.join(POLICIES)}")
    names = list(dict.fromkeys(policy)) or list(POLICIES)
    specs = [make_policy(p, capacity_tokens=kv_capacity) if p == "kv_blocks" and kv_capacity else make_policy(p)
             for p in names]
    try:
        requests = read_trace(trace)
        sheet = load_price_sheet(prices or get_settings().prices_file or None) if "kv_blocks" in names else None
        result = simulate(requests, specs, sheet)
        proposals = advise(requests, result, sheet)
    except (TraceError, PriceError, ValueError) as exc:
        fail(str(exc))
    if as_json:
        typer.echo(json.dumps({"trace": str(trace), "requests": len(requests), "results": result.to_json(),
                               "advice": [p.to_json() for p in proposals]}, indent=2))
        return
    _print_sim(trace, len(requests), result, proposals)


def _print_sim(trace: Path, n: int, result, proposals) -> None:
    import sys

    from rich.table import Table

    from mainspring.billing.simulator import usd

    out = Console(width=None if sys.stdout.isatty() else 160, highlight=False)
    policies = result.policies
    tokens = Table(title=f"{trace}: {n} requests, tokens by class (cache scenario)", title_justify="left")
    for col in ("policy", "prices", "input", "cache read", "cache write", "uncached", "output", "hit rate"):
        tokens.add_column(col, justify="left" if col in ("policy", "prices") else "right")
    for p in policies:
        r = result.get("cache", p)
        t = r.totals
        tokens.add_row(p, r.prices, f"{t.input_total:,}", f"{t.cache_read:,}", f"{t.cache_write:,}",
                       f"{t.uncached:,}", f"{t.output:,}", f"{r.hit_rate:.1%}")
    out.print(tokens)
    cost = Table(title="Cost in USD by scenario (reductions vs no cache, same prices)", title_justify="left")
    for col in ("policy", "scenario", "uncached", "cache read", "cache write", "output", "total", "$/1M input",
                "input ×", "total ×"):
        cost.add_column(col, justify="left" if col in ("policy", "scenario") else "right")
    for p in policies:
        for (sc, pol), r in result.results.items():
            if pol != p:
                continue
            t = r.totals
            cost.add_row(p, sc, usd(t.uncached_u), usd(t.cache_read_u), usd(t.cache_write_u), usd(t.output_u),
                         usd(t.total_u), f"{r.effective_input_price:.4f}", f"{r.input_factor:.2f}",
                         f"{r.total_factor:.2f}")
        cost.add_section()
    out.print(cost)
    if not proposals:
        out.print("advisor: nothing to propose for this trace")
        return
    adv = Table(title="Advisor: each proposal re-simulated on a copy of the trace (Δ total, cache scenario; "
                "negative saves)", title_justify="left")
    for col in ("rule", "requests", *(f"Δ {p}" for p in policies), "advice"):
        adv.add_column(col, justify="right" if col.startswith("Δ") or col == "requests" else "left")
    for pr in proposals:
        adv.add_row(pr.rule, str(pr.affected or "-"),
                    *(usd(pr.deltas_u[p]) if p in pr.deltas_u else "-" for p in policies), pr.advice)
    out.print(adv)

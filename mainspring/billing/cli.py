"""`mainspring keys create|list|revoke` and `mainspring usage`, wired in by mainspring/cli.py:

    app.add_typer(keys_app, name="keys")
    app.command("usage")(usage)

Every command works on Settings' database (migrated on first use). Bad input prints a message and
exits with code 2, never a traceback.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import NoReturn, Optional

import typer
from rich.console import Console

from mainspring.billing import budgets, keys, reports
from mainspring.billing.prices import PriceError, usd_to_micro

keys_app = typer.Typer(help="API keys: create (secret shown once), list, revoke.", no_args_is_help=True)
err = Console(stderr=True)


def _fail(msg: str) -> NoReturn:
    err.print(f"[red]error:[/red] {msg}", highlight=False)
    raise typer.Exit(2)


def _session(readonly: bool = False):
    """A session on Settings' database, migrating it first (cheap when already current)."""
    from pydantic import ValidationError
    from sqlalchemy.exc import SQLAlchemyError

    from mainspring.config import Settings
    from mainspring.store.db import init_db, session

    try:
        url = Settings().resolved_database_url()
        init_db(url)
    except ValidationError as exc:
        _fail(f"bad setting: {exc.errors()[0]['loc'][0]}: {exc.errors()[0]['msg']}")
    except (SQLAlchemyError, OSError) as exc:
        _fail(f"cannot open the database: {exc}")
    return session(url, readonly=readonly)


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
            _fail(f"--budget {budget!r} is not an amount in USD >= 0, e.g. 5.00")
    if period not in budgets.PERIODS:
        _fail(f"--period {period!r} is not one of {', '.join(budgets.PERIODS)}")
    try:
        with _session() as s:
            made = keys.create_key(s, project, name, rpm_limit=rpm, tpm_limit=tpm)
            if limit_u is not None:
                budgets.set_budget(s, "key", made.key.id, period, limit_u)
    except (keys.KeyAdminError, budgets.BudgetError) as exc:
        _fail(str(exc))
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
        _fail(str(exc))
    typer.echo(f"revoked {k.id} at {k.revoked_at:%Y-%m-%d %H:%M:%S} UTC")


def _date(flag: str, v: Optional[str]) -> Optional[datetime]:
    if v is None:
        return None
    try:
        return datetime.strptime(v, "%Y-%m-%d").replace(tzinfo=timezone.utc)
    except ValueError:
        _fail(f"{flag} {v!r} is not a date like 2025-06-01")


def usage(
    by: str = typer.Option("key", "--by", help="group by: key, project, model, tier or day"),
    since: Optional[str] = typer.Option(None, "--since", help="from this UTC date (YYYY-MM-DD)"),
    until: Optional[str] = typer.Option(None, "--until", help="before this UTC date (YYYY-MM-DD)"),
    csv_file: Optional[Path] = typer.Option(None, "--csv", help="also write the report as CSV to this file"),
) -> None:
    """Usage and cost from the ledger, with cache hit rate and cache savings."""
    if by not in reports.GROUPS:
        _fail(f"--by {by!r} is not one of {', '.join(reports.GROUPS)}")
    start, end = _date("--since", since), _date("--until", until)
    with _session(readonly=True) as s:
        rows = reports.usage_report(s, by, start, end)
    if csv_file is not None:
        try:
            reports.write_csv(rows, csv_file, by)
        except OSError as exc:
            _fail(f"cannot write {csv_file}: {exc.strerror or exc}")
    if not rows:
        typer.echo("no usage recorded")
        return
    _table([by, "requests", "input", "cached", "hit rate", "output", "cost", "saved by cache"],
           [[r.group, str(r.requests), str(r.input_total), str(r.cache_read), f"{r.cache_hit_rate:.1%}",
             str(r.output), budgets.usd(r.cost_u), budgets.usd(r.savings_u)] for r in rows])

"""`mainspring projects show|set|sweep`: a project's data policy (mainspring/store/data_policy.py), wired in by
mainspring/cli.py:

    app.add_typer(projects_app, name="projects")

Every command works on Settings' database (migrated on first use). Bad input prints a message and exits with
code 2, never a traceback.
"""

from __future__ import annotations

from typing import Optional

import typer

from mainspring.config import get_settings
from mainspring.console import fail
from mainspring.store.data_policy import UNCHANGED, DataPolicy, PolicyError, check_retention, find_project, set_policy

projects_app = typer.Typer(help="projects' data policy: show, set, sweep.", no_args_is_help=True)


def _session(readonly: bool = False):
    from mainspring.store.db import cli_session

    return cli_session(fail, readonly=readonly)


def _print(name: str, policy: DataPolicy) -> None:
    typer.echo(f"project: {name}")
    typer.echo(f"training: {'allowed' if policy.training_allowed else 'never'}")
    typer.echo(f"local-only: {'yes' if policy.local_only else 'no'}")
    days = policy.retention_days
    typer.echo(f"retention: {'keep' if days is None else f'{days} days'}")


def _retention(value: str) -> int | None:
    if value.strip().lower() in ("none", "keep"):
        return None
    try:
        return check_retention(int(value))
    except ValueError as exc:
        fail(str(exc) if isinstance(exc, PolicyError) else
             f"--retention-days {value!r} is not a number of days (1 or more) or none")


@projects_app.command("show")
def show(project: str = typer.Argument(..., help="the project's name")) -> None:
    """The project's data policy: training, local-only, retention."""
    with _session(readonly=True) as s:
        try:
            p = find_project(s, project)
        except PolicyError as exc:
            fail(str(exc))
        policy = DataPolicy.of(p)
    _print(project, policy)


@projects_app.command("set")
def set_(
    project: str = typer.Argument(..., help="the project's name"),
    training: Optional[bool] = typer.Option(None, "--training/--no-training",
                                            help="may the project's data be used for training and exports"),
    local_only: Optional[bool] = typer.Option(None, "--local-only/--no-local-only",
                                              help="refuse upstream models for the project's data"),
    retention_days: Optional[str] = typer.Option(None, "--retention-days",
                                                 help="delete stored prompts and outputs older than N days; "
                                                      "none keeps them"),
) -> None:
    """Change the settings given; the others stay as they are."""
    if training is None and local_only is None and retention_days is None:
        fail("nothing to set: give --training/--no-training, --local-only/--no-local-only or --retention-days")
    days = UNCHANGED if retention_days is None else _retention(retention_days)
    with _session() as s:
        try:
            p = find_project(s, project)
            policy = set_policy(s, p.id, training_allowed=training, local_only=local_only, retention_days=days)
        except PolicyError as exc:
            fail(str(exc))
    _print(project, policy)


@projects_app.command("sweep")
def sweep_cmd(
    project: Optional[str] = typer.Option(None, "--project", "-p", help="only this project"),
    dry_run: bool = typer.Option(False, "--dry-run", help="count what would be deleted, delete nothing"),
) -> None:
    """Delete stored prompts and outputs older than each project's retention (the server also does this)."""
    from mainspring.store.retention import DEFAULT_LIMIT, sweep

    DRY_RUN_LIMIT = 10**9  # nothing is deleted, so nothing needs bounding

    settings = get_settings()
    with _session(readonly=True) as s:  # migrates, and checks the project's name
        if project is not None:
            try:
                find_project(s, project)
            except PolicyError as exc:
                fail(str(exc))
    url = settings.resolved_database_url()
    # bounded passes until one finds nothing (a dry run deletes nothing, so one pass counts it all)
    totals: dict[str, list[int]] = {}
    while True:
        results = sweep(url, settings.data_dir, project=project, dry_run=dry_run,
                        limit=DRY_RUN_LIMIT if dry_run else DEFAULT_LIMIT)
        for r in results:
            t = totals.setdefault(f"{r.project} ({r.retention_days} days)", [0, 0, 0, 0])
            t[0], t[1], t[2], t[3] = t[0] + r.responses, t[1] + r.batches, t[2] + r.files, t[3] + r.scene_threads
        if dry_run or not any(r.total for r in results):
            break
    if not totals:
        typer.echo("no project has a retention setting")
    verb = "would delete" if dry_run else "deleted"
    for name, (responses, batches, files, threads) in totals.items():
        typer.echo(f"{name}: {verb} {responses} responses, {batches} batches, {files} files, {threads} scene threads")

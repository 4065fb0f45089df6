"""billing/reports: usage by key/project/model/tier/day, cache hit rate and savings, CSV; the `usage` command."""

import csv
import io
from datetime import datetime, timezone

import pytest
import typer
from typer.testing import CliRunner

from mainspring.billing import ledger, reports
from mainspring.billing.cli import usage
from mainspring.billing.keys import create_key
from mainspring.billing.prices import price
from mainspring.billing.usage import UsageRecord
from mainspring.store.db import session

SMOL = "SmolLM2-135M-Instruct"


def _seed(url, sheet):
    """acme/k1: two standard calls, one mostly cached; acme/k2: one fast call, half cached;
    beta/k3: one call on the -fast model, then reversed. Returns the three keys."""
    with session(url) as s:
        ledger.register_price_sheet(s, sheet)
        k1, k2 = create_key(s, "acme").key, create_key(s, "acme").key
        k3 = create_key(s, "beta").key
        calls = [
            ("r1", k1, UsageRecord(model=SMOL, input_total=10_000, cache_read=9_000, output_total=1_000)),
            ("r2", k1, UsageRecord(model=SMOL, input_total=2_000, output_total=500)),
            ("r3", k2, UsageRecord(model=SMOL, tier="fast", input_total=4_000, cache_read=2_000, output_total=100)),
            ("r4", k3, UsageRecord(model=SMOL + "-fast", input_total=1_000, output_total=1_000)),
        ]
        for rid, key, rec in calls:
            ledger.record(s, rid, key, rec, price(rec, sheet))
        ledger.reverse(s, ledger.entries(s, request_id="r4")[0].id, "refund")
    return k1, k2, k3


def test_report_by_key_with_hit_rate_and_savings(db, sheet):
    k1, k2, k3 = _seed(db, sheet)
    with session(db, readonly=True) as s:
        rows = {r.group: r for r in reports.usage_report(s, "key")}
    r1 = rows[k1.id]
    assert (r1.requests, r1.input_total, r1.cache_read, r1.output) == (2, 12_000, 9_000, 1_500)
    assert r1.cache_hit_rate == pytest.approx(0.75)
    # cost: uncached 3000 × 0.10 + cached 9000 × 0.01 + output 1500 × 0.40
    assert r1.cost_u == 300 + 90 + 600
    # savings: 9000 cached tokens at 0.10 instead of 0.01
    assert r1.savings_u == 900 - 90
    r2 = rows[k2.id]  # fast tier: 2× prices, so 2× savings per token
    assert r2.cache_hit_rate == pytest.approx(0.5) and r2.savings_u == 2_000 * 20 // 100 - 2_000 * 2 // 100
    r3 = rows[k3.id]  # reversed: nets to nothing
    assert (r3.requests, r3.input_total, r3.output, r3.cost_u, r3.savings_u) == (0, 0, 0, 0, 0)
    assert r3.cache_hit_rate == 0.0
    assert list(rows) == [k1.id, k2.id, k3.id]  # most expensive first


def test_report_groupings(db, sheet):
    _seed(db, sheet)
    today = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    with session(db, readonly=True) as s:
        by = {g: {r.group: r for r in reports.usage_report(s, g)} for g in reports.GROUPS}
        assert reports.usage_report(s, "day", since=datetime(2999, 1, 1, tzinfo=timezone.utc)) == []
        with pytest.raises(reports.ReportError, match="choose one of"):
            reports.usage_report(s, "colour")
    assert set(by["project"]) == {"acme", "beta"} and by["project"]["acme"].requests == 3
    assert set(by["model"]) == {SMOL, SMOL + "-fast"} and by["model"][SMOL].requests == 3
    assert set(by["tier"]) == {"standard", "fast"}
    assert set(by["day"]) == {today}
    totals = {g: sum(r.cost_u for r in rows.values()) for g, rows in by.items()}
    assert len(set(totals.values())) == 1  # every grouping adds up to the same net total


def test_csv_export(db, sheet, tmp_path):
    k1, *_ = _seed(db, sheet)
    with session(db, readonly=True) as s:
        rows = reports.usage_report(s, "key")
    reports.write_csv(rows, tmp_path / "u.csv", by="key")
    parsed = list(csv.DictReader(io.StringIO((tmp_path / "u.csv").read_text())))
    assert parsed[0] == {"key": k1.id, "requests": "2", "input_total": "12000", "input_uncached": "3000",
                         "cache_read": "9000", "cache_write": "0", "output": "1500", "reasoning": "0",
                         "cache_hit_rate": "0.7500", "cost_usd": "0.00099", "savings_usd": "0.00081"}
    assert reports.to_csv(rows).splitlines()[0].startswith("group,requests")


@pytest.fixture
def usage_app(monkeypatch, tmp_path, blank_database_url):
    """The `usage` command on Settings' database: the data dir's SQLite file, or Postgres by URL."""
    monkeypatch.setenv("MAINSPRING_DATA_DIR", str(tmp_path))
    if blank_database_url.startswith("sqlite"):  # the default URL, as a user without the setting gets
        monkeypatch.delenv("MAINSPRING_DATABASE_URL", raising=False)
    else:
        monkeypatch.setenv("MAINSPRING_DATABASE_URL", blank_database_url)
    app = typer.Typer()
    app.command("usage")(usage)  # as mainspring/cli.py wires it
    app.command("noop")(lambda: None)  # two commands, so "usage" stays a subcommand like in the real app
    yield app, blank_database_url


def test_usage_command(usage_app, sheet, tmp_path):
    app, url = usage_app
    runner = CliRunner()
    r = runner.invoke(app, ["usage"])
    assert r.exit_code == 0 and "no usage recorded" in r.stdout
    _seed(url, sheet)
    r = runner.invoke(app, ["usage", "--by", "project", "--csv", str(tmp_path / "out.csv")])
    assert r.exit_code == 0, r.output
    assert "acme" in r.stdout and "hit rate" in r.stdout and "68.8%" in r.stdout
    assert (tmp_path / "out.csv").read_text().startswith("project,requests")
    r = runner.invoke(app, ["usage", "--by", "model", "--since", "2000-01-01", "--until", "2999-01-01"])
    assert r.exit_code == 0 and SMOL in r.stdout


@pytest.mark.parametrize("args, message", [
    (["usage", "--by", "colour"], "--by"),
    (["usage", "--since", "yesterday"], "--since"),
    (["usage", "--csv", "/nonexistent-dir/x.csv"], "cannot write"),
])
def test_usage_command_bad_input(usage_app, args, message):
    r = CliRunner().invoke(usage_app[0], args)
    assert r.exit_code == 2 and message in r.stderr and isinstance(r.exception, SystemExit)

"""Two workers claiming at the same moment never both take a run (on Postgres, claiming locks FOR UPDATE SKIP LOCKED;
on SQLite, BEGIN IMMEDIATE serialises the claims)."""

import threading

from sqlalchemy import event, select

from mainspring.agents import leases
from mainspring.agents.tables import RunRow
from mainspring.store.db import get_engine, session
from tests.agents.conftest import PolicyModel, make_runtime, spec
from tests.databases import is_postgres


def test_a_claim_inside_another_claim_takes_other_runs(tmp_path, db_url):
    rt = make_runtime(tmp_path, db_url, PolicyModel(), {})
    rt.put_agent(spec(tools=()))
    runs = [rt.start_run("tester", f"job {i}").id for i in range(4)]
    b: list[tuple[str, bool]] = []
    worker_b: list[threading.Thread] = []

    def claim_meanwhile(conn, cursor, statement, params, context, executemany):
        # worker B claims right after worker A has read its candidates inside A's write transaction
        if not worker_b and "FROM runs" in statement and "WHERE runs.id IN" in statement:
            worker_b.append(threading.Thread(target=lambda: b.extend(leases.claim(db_url, "host:2:b", 2, 30))))
            worker_b[0].start()
            if is_postgres(db_url):  # B runs to its commit while A holds its rows (on SQLite it waits for A's lock)
                worker_b[0].join()

    engine = get_engine(db_url)
    event.listen(engine, "after_cursor_execute", claim_meanwhile)
    try:
        a = leases.claim(db_url, "host:1:a", 2, 30)
    finally:
        event.remove(engine, "after_cursor_execute", claim_meanwhile)
    assert worker_b
    worker_b[0].join()
    taken_a, taken_b = {r for r, _ in a}, {r for r, _ in b}
    assert len(taken_a) == 2 and len(taken_b) == 2 and not taken_a & taken_b
    with session(db_url, readonly=True) as s:
        owners = dict(s.execute(select(RunRow.id, RunRow.lease_owner).where(RunRow.id.in_(runs))).all())
    assert {r: owners[r] for r in taken_a} == {r: "host:1:a" for r in taken_a}  # A's claims were not overwritten
    assert {r: owners[r] for r in taken_b} == {r: "host:2:b" for r in taken_b}

"""The leader lease: a holder whose lease expired and was taken over while it renewed does not lead too."""

import threading
import time

from sqlalchemy import event

from mainspring.agents.plans import leader
from mainspring.store.db import get_engine
from tests.databases import is_postgres


def test_a_renewal_racing_a_takeover_leaves_one_leader(db_url):
    assert leader.hold(db_url, "test-lease", "elsewhere:1:a", 0.01) == 1
    time.sleep(0.05)  # A's lease expired: B may take it
    b_term: list[int | None] = []
    worker_b: list[threading.Thread] = []

    def take_over_meanwhile(conn, cursor, statement, params, context, executemany):
        # B takes the expired lease right after A read the row for its renewal, before A writes
        if not worker_b and statement.lstrip().upper().startswith("SELECT") and "leader_leases" in statement:
            worker_b.append(threading.Thread(target=lambda: b_term.append(
                leader.hold(db_url, "test-lease", "elsewhere:2:b", 300))))
            worker_b[0].start()
            if is_postgres(db_url):  # B commits now (on SQLite it waits for A's write lock)
                worker_b[0].join()

    engine = get_engine(db_url)
    event.listen(engine, "after_cursor_execute", take_over_meanwhile)
    try:
        a_term = leader.hold(db_url, "test-lease", "elsewhere:1:a", 300)
    finally:
        event.remove(engine, "after_cursor_execute", take_over_meanwhile)
    worker_b[0].join()
    holder = leader.holder(db_url, "test-lease")
    assert [t for t in (a_term, b_term[0]) if t is not None] == [holder.term]  # exactly one leads: the holder
    assert holder.owner == ("elsewhere:2:b" if b_term[0] else "elsewhere:1:a")

"""The audit trail: an append-only, hash-chained log of every decision step of a run.

Entry n stores hash_n = sha256(hash_{n-1} | kind | created_at | payload), payload as canonical JSON. Editing any
entry's payload, kind or time, its hash, deleting or reordering entries breaks the chain at that entry, which
`verify` reports. (Dropping the newest entries is detectable only against a head hash kept elsewhere: `head`.)
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Iterator

from sqlalchemy import select
from sqlalchemy.orm import Session

from mainspring.agents.tables import AuditRow

GENESIS = "0" * 64


def canonical(payload: Any) -> str:
    return json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def entry_hash(prev_hash: str, kind: str, created_at: str, payload_json: str) -> str:
    return hashlib.sha256("|".join((prev_hash, kind, created_at, payload_json)).encode()).hexdigest()


def link(run_id: str, prev_seq: int, prev_hash: str, kind: str, body: str) -> dict:
    """The row that follows (prev_seq, prev_hash) in a run's chain; `body` is the payload's canonical JSON.
    (Entries are written by writes.Batch.audit: a batch chains all its entries from one read of the head.)"""
    created = datetime.now(timezone.utc).isoformat()
    return {"run_id": run_id, "seq": prev_seq + 1, "kind": kind, "payload_json": body, "created_at": created,
            "prev_hash": prev_hash, "hash": entry_hash(prev_hash, kind, created, body)}


@dataclass
class Verdict:
    ok: bool
    entries: int
    head: str  # hash of the last entry
    broken_at: int | None = None  # seq of the first entry that fails
    reason: str = ""


def verify(s: Session, run_id: str) -> Verdict:
    rows = s.scalars(select(AuditRow).where(AuditRow.run_id == run_id).order_by(AuditRow.seq)).all()
    prev = GENESIS
    for expected_seq, row in enumerate(rows, start=1):
        if row.seq != expected_seq:
            return Verdict(False, len(rows), prev, row.seq, f"entry {expected_seq} is missing")
        if row.prev_hash != prev:
            return Verdict(False, len(rows), prev, row.seq, "does not link to the entry before it")
        if entry_hash(row.prev_hash, row.kind, row.created_at, row.payload_json) != row.hash:
            return Verdict(False, len(rows), prev, row.seq, "content does not match its hash (edited)")
        prev = row.hash
    return Verdict(True, len(rows), prev)


def export_jsonl(s: Session, run_id: str) -> Iterator[str]:
    for row in s.scalars(select(AuditRow).where(AuditRow.run_id == run_id).order_by(AuditRow.seq)):
        yield json.dumps({"run_id": run_id, "seq": row.seq, "kind": row.kind, "created_at": row.created_at,
                          "payload": json.loads(row.payload_json), "prev_hash": row.prev_hash, "hash": row.hash})

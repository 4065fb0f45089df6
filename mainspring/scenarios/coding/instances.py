"""The minibench's task instances, in SWE-bench's shape: an id, a repository snapshot, the problem statement, the
tests that must go from failing to passing (FAIL_TO_PASS) and those that must keep passing (PASS_TO_PASS), the
gold patch and the hidden test patch (unified diffs against the snapshot).

    minibench_data/<repo>/             the snapshot each of the repository's instances starts from
    minibench_data/instances.jsonl     one instance a line (built by minibench_data/source/build.py)
    minibench_data/humaneval.jsonl     the HumanEval-style functions (humaneval.py)

SWE-bench stores FAIL_TO_PASS and PASS_TO_PASS as JSON strings; both that and plain lists are read. Beyond its
fields: `kind` (off-by-one, rounding mode, ...), `difficulty`, `underspecified`, and `naive_patch`: the tempting
fix that breaks a PASS_TO_PASS test, for the harness's own tests.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

DATA_DIR = Path(__file__).resolve().parent / "minibench_data"
INSTANCES_FILE = DATA_DIR / "instances.jsonl"


@dataclass(frozen=True)
class Instance:
    instance_id: str
    repo: str  # the snapshot's folder name under the data directory
    problem_statement: str
    FAIL_TO_PASS: tuple[str, ...]
    PASS_TO_PASS: tuple[str, ...]
    patch: str  # gold
    test_patch: str  # hidden tests
    hints_text: str = ""
    kind: str = ""
    difficulty: str = ""
    underspecified: bool = False
    naive_patch: str = ""
    data_dir: Path = DATA_DIR

    @property
    def snapshot(self) -> Path:
        return self.data_dir / self.repo

    @property
    def test_ids(self) -> tuple[str, ...]:
        """What the harness runs: FAIL_TO_PASS then PASS_TO_PASS."""
        return self.FAIL_TO_PASS + self.PASS_TO_PASS

    def to_dict(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items() if k != "data_dir"}


def _ids(value: Any, field: str, iid: str) -> tuple[str, ...]:
    if isinstance(value, str):  # SWE-bench's JSON-in-a-string
        value = json.loads(value)
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ValueError(f"instance {iid}: {field} must be a list of pytest node ids")
    return tuple(value)


def parse_instance(record: dict[str, Any], data_dir: Path = DATA_DIR) -> Instance:
    """An Instance from one JSON record; ValueError naming the field that is wrong."""
    iid = record.get("instance_id")
    if not isinstance(iid, str) or not iid:
        raise ValueError("an instance needs an instance_id")
    for name in ("repo", "problem_statement", "patch", "test_patch"):
        if not isinstance(record.get(name), str) or not record[name]:
            raise ValueError(f"instance {iid}: {name} is missing")
    inst = Instance(iid, record["repo"], record["problem_statement"],
                    _ids(record.get("FAIL_TO_PASS"), "FAIL_TO_PASS", iid),
                    _ids(record.get("PASS_TO_PASS", []), "PASS_TO_PASS", iid), record["patch"], record["test_patch"],
                    hints_text=record.get("hints_text") or "", kind=record.get("kind") or "",
                    difficulty=record.get("difficulty") or "", underspecified=bool(record.get("underspecified")),
                    naive_patch=record.get("naive_patch") or "", data_dir=Path(data_dir))
    if not inst.FAIL_TO_PASS:
        raise ValueError(f"instance {iid}: FAIL_TO_PASS is empty: nothing would tell a fix from none")
    if not inst.snapshot.is_dir():
        raise ValueError(f"instance {iid}: no snapshot folder {inst.snapshot}")
    return inst


def load_instances(path: Path = INSTANCES_FILE, ids: Iterable[str] | None = None) -> list[Instance]:
    """The instances of a JSONL file (the minibench's by default), in file order; `ids` picks some (ValueError
    for an unknown id). Snapshots are looked up beside the file."""
    path = Path(path)
    out = [parse_instance(json.loads(line), path.parent)
           for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if ids is None:
        return out
    wanted = list(ids)
    by_id = {i.instance_id: i for i in out}
    unknown = [i for i in wanted if i not in by_id]
    if unknown:
        raise ValueError(f"unknown instance ids {unknown}; known: {', '.join(by_id)}")
    return [by_id[i] for i in wanted]

"""The lines of one batch: checking the input JSONL, the progress journal, the output and error files.

Input line (OpenAI): `{"custom_id": str, "method": "POST", "url": <the batch's endpoint>, "body": {...}}`.
A line that breaks these rules fails on its own, into the error file; the others still run.
Output line: `{"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error": null}`;
a line that never reached the endpoint has `"response": null, "error": {"code", "message"}`.
A request the endpoint answered with an error status goes to the error file with its response.

The journal (`data_dir/batches/<batch id>.progress.jsonl`) is the per-line progress: one record per
finished line, appended and fsynced as the line finishes. On a restart the runner skips the lines in
it; a line that finished but was not journaled yet runs again, and the ledger's unique request id
(`batch_request_id`) keeps it from being billed twice.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from mainspring.api.body_limit import lone_surrogate_path, surrogate_error
from mainspring.api.routes import new_id

ENDPOINTS = ("/v1/chat/completions", "/v1/completions")
MAX_LINES = 50_000


class BatchInputError(Exception):
    """The input file as a whole cannot be run (missing, not UTF-8, no lines): the batch fails."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


@dataclass(frozen=True)
class Line:
    no: int  # 1-based line number in the input file, blank lines included
    custom_id: str
    body: dict[str, Any]

    @property
    def prefix_key(self) -> str:
        """Sorting by this puts lines with the same prompt start next to each other, so they run
        together and the prefix cache computes the shared part once."""
        prompt = self.body.get("messages", self.body.get("prompt", ""))
        return str(self.body.get("model", "")) + "\x00" + json.dumps(prompt, sort_keys=True, ensure_ascii=False)


@dataclass
class Plan:
    lines: list[Line] = field(default_factory=list)  # the runnable lines, in input order
    invalid: list[dict[str, Any]] = field(default_factory=list)  # error records of the others
    total: int = 0  # non-blank lines


def error_record(no: int, custom_id: str | None, code: str, message: str) -> dict[str, Any]:
    return {"line": no, "id": new_id("batch_req_"), "custom_id": custom_id, "response": None,
            "error": {"code": code, "message": message}}


def response_record(line: Line, status_code: int, body: dict[str, Any]) -> dict[str, Any]:
    request_id = body.get("id") if isinstance(body.get("id"), str) else new_id("req_")
    return {"line": line.no, "id": new_id("batch_req_"), "custom_id": line.custom_id,
            "response": {"status_code": status_code, "request_id": request_id, "body": body}, "error": None}


def is_success(record: dict[str, Any]) -> bool:
    resp = record.get("response")
    return resp is not None and 200 <= resp["status_code"] < 300


def plan_batch(path: Path, endpoint: str) -> Plan:
    """Reads and checks every line; the same file always gives the same plan (so a restart can redo it)."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise BatchInputError("file_not_found", f"the input file cannot be read: {e.strerror or e}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise BatchInputError("invalid_file_format", "the input file is not UTF-8 JSONL") from None
    plan, seen = Plan(), set[str]()
    # split on "\n" only: str.splitlines() would also cut at U+2028, which JSON strings may contain raw
    for no, raw in enumerate(text.split("\n"), start=1):
        if not raw.strip():
            continue
        plan.total += 1
        if plan.total > MAX_LINES:
            raise BatchInputError("too_many_requests", f"a batch has at most {MAX_LINES} requests")
        checked = _check_line(no, raw, endpoint, seen)
        if isinstance(checked, Line):
            plan.lines.append(checked)
        else:
            plan.invalid.append(checked)
    if plan.total == 0:
        raise BatchInputError("empty_file", "the input file has no requests")
    return plan


def _check_line(no: int, raw: str, endpoint: str, seen: set[str]) -> Line | dict[str, Any]:
    try:
        obj = json.loads(raw)
    except ValueError as e:
        return error_record(no, None, "invalid_json_line", f"line {no} is not valid JSON: {e}")
    if not isinstance(obj, dict):
        return error_record(no, None, "invalid_request", f"line {no} is not a JSON object")
    custom_id = obj.get("custom_id")
    bad_text = lone_surrogate_path(obj) if "\\u" in raw else None  # "\ud800": no route or UTF-8 file takes it
    if bad_text is not None:
        return error_record(no, custom_id if bad_text != "custom_id" and isinstance(custom_id, str) else None,
                            "invalid_unicode", f"line {no}: {surrogate_error(bad_text).message}")
    if not isinstance(custom_id, str) or not custom_id:
        return error_record(no, None, "missing_custom_id", f"line {no} has no custom_id (a non-empty string)")
    if custom_id in seen:  # the first line with an id runs; a later one would make the output ambiguous
        return error_record(no, custom_id, "duplicate_custom_id",
                            f"line {no}: custom_id {custom_id!r} is used by an earlier line; custom_ids must be unique")
    seen.add(custom_id)
    if obj.get("method") != "POST":
        return error_record(no, custom_id, "invalid_method", f"line {no}: method must be \"POST\"")
    if obj.get("url") != endpoint:
        return error_record(no, custom_id, "invalid_url",
                            f"line {no}: url {obj.get('url')!r} does not match the batch's endpoint {endpoint}")
    if not isinstance(obj.get("body"), dict):
        return error_record(no, custom_id, "invalid_body", f"line {no}: body must be a JSON object")
    return Line(no, custom_id, obj["body"])


class Journal:
    """Append-only progress of one batch: one JSON record per finished line, fsynced."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fh: BinaryIO | None = None

    def load(self) -> dict[int, dict[str, Any]]:
        """Line number -> record. A torn last record (a crash mid-write) is cut off, so the next
        append starts on a clean line."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return {}
        good = data.rfind(b"\n") + 1
        if good < len(data):
            with open(self.path, "r+b") as fh:
                fh.truncate(good)
        done: dict[int, dict[str, Any]] = {}
        for raw in data[:good].splitlines():
            try:
                rec = json.loads(raw)
                done[int(rec["line"])] = rec
            except (ValueError, KeyError, TypeError):
                continue  # a damaged record: that line simply runs again
        return done

    def append(self, record: dict[str, Any]) -> None:
        if self._fh is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = open(self.path, "ab")
        self._fh.write(json.dumps(record, ensure_ascii=False, separators=(",", ":")).encode() + b"\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def remove(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)


def _write_lines(out: BinaryIO, records: list[dict[str, Any]]) -> None:
    for rec in sorted(records, key=lambda r: r["line"]):
        shown = {k: v for k, v in rec.items() if k != "line"}  # `line` is ours, not part of OpenAI's shape
        out.write(json.dumps(shown, ensure_ascii=False, separators=(",", ":")).encode() + b"\n")


def split_results(plan: Plan, done: dict[int, dict[str, Any]]) -> tuple[list[dict], list[dict]]:
    """(output records, error records), each in input order."""
    ok = [r for r in done.values() if is_success(r)]
    failed = [r for r in done.values() if not is_success(r)] + plan.invalid
    return ok, failed


def writer(records: list[dict[str, Any]]):
    """A `write(fh)` callback for `files.store_file` that writes `records` as JSONL in input order."""
    return lambda out: _write_lines(out, records)

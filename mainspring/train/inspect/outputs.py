"""Output quality of what the platform serves: the inspection checks applied to batch outputs and
recorded agent runs instead of a training domain.

`check_outputs(records)` reports schema validity (jsonschema, for outputs that promised a schema),
refusals (a small phrase detector), the length distribution with the share cut by the token cap
(finish_reason "length"), empty outputs and failed requests. Records come from two loaders:

- `records_from_batch(output_file, input_file)`: an OpenAI batch output JSONL (api/batch_lines.py
  describes the lines); the input file, when given, supplies each request's `response_format`.
- `records_from_agent_runs(db)`: the agent journal's completed model steps. The agents are a layer
  above train, so this reads their `steps` table by name through SQLAlchemy Core (reflected, read
  only) instead of importing their code. A project whose data policy says never-for-training is
  refused when named and left out otherwise (store/data_policy.py).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

from mainspring.train.inspect.findings import Finding

MAX_LISTED = 20  # per-record evidence kept in one finding; item_ids lists them all


@dataclass(frozen=True)
class OutputRecord:
    id: str  # batch custom_id (+ "#i" past the first choice), or the agent step id
    text: str
    expected_schema: dict[str, Any] | None = None  # the JSON schema the output promised, if any
    finish_reason: str | None = None  # "stop" | "length" | "tool_calls" | "error" (the request failed)


# -- refusals -----------------------------------------------------------------------------------------
_CANT = r"(?: can ?not| can't| cannot| won't| will not| am unable to|'m unable to| am not able to|'m not able to)"
_REFUSAL = re.compile("|".join((
    rf"\bi{_CANT} (?:help|assist|comply|provide|do that|fulfil|fulfill|support|answer|create|generate|write|"
    r"share|engage|continue|complete|give|offer|discuss)",
    rf"\b(?:i'm |i am )?(?:sorry|afraid)\b[^.!?\n]{{0,40}}\bi{_CANT}",
    rf"\b(?:apologies|i apologi[sz]e)\b[^.!?\n]{{0,40}}\bi{_CANT}",
    r"\bas an ai(?: language model| assistant| model)?,? i (?:can ?not|can't|cannot|don't|do not|am not)\b",
    r"\bi (?:must|have to) (?:respectfully )?(?:decline|refuse)\b",
    r"\bthat(?:'s| is) not something i (?:can|am able to|will)\b",
    r"\bi'?m not (?:allowed|permitted) to\b",
)))
_QUOTED = re.compile(r'"[^"]*"|\u201c[^\u201d]*\u201d')
_HEAD = 300  # a refusal says so up front; an answer that quotes one further down is not one


def is_refusal(text: str) -> bool:
    """True when the opening of `text` declines the request ("I'm sorry, but I can't help with that")."""
    head = text[:_HEAD].casefold().replace("\u2019", "'")
    head = _QUOTED.sub(" ", head)  # a reply that quotes someone's refusal is not one
    return _REFUSAL.search(" ".join(head.split())) is not None


# -- the check --------------------------------------------------------------------------------------------
def check_outputs(records: Iterable[OutputRecord], *, name: str = "outputs", refusal_warn: float = 0.05,
                  truncated_warn: float = 0.1) -> list[Finding]:
    """Findings about a set of served outputs; `name` is the Finding.domain (a batch id, an agent)."""
    recs = list(records)
    if not recs:
        return [Finding("outputs.no_records", "warning", name, "no outputs to inspect",
                        fix="point the loader at a batch output file or a database with agent runs")]
    failed = [r for r in recs if r.finish_reason == "error"]
    served = [r for r in recs if r.finish_reason != "error"]
    out = [_summary(name, recs, served)]
    if failed:
        out.append(Finding("outputs.errors", "warning", name, f"{len(failed)} of {len(recs)} requests failed",
                           _ids(failed), {"count": len(failed), "share": _share(failed, recs)},
                           "read the batch's error file or the runs' errors"))
    empty = [r for r in served if not r.text.strip()]
    if empty:
        out.append(Finding("outputs.empty", "warning", name, f"{len(empty)} of {len(served)} outputs are empty",
                           _ids(empty), {"count": len(empty), "share": _share(empty, served),
                                         "of_which_cut_by_length": sum(r.finish_reason == "length" for r in empty)},
                           "check the prompts and stop sequences: an empty answer is never useful"))
    cut = [r for r in served if r.finish_reason == "length"]
    if cut:
        share = _share(cut, served)
        out.append(Finding("outputs.truncated", "warning" if share > truncated_warn else "info", name,
                           f"{share:.0%} of outputs were cut at the token cap (finish_reason \"length\")",
                           _ids(cut), {"count": len(cut), "share": share},
                           "raise max_tokens or ask for shorter answers"))
    refused = [r for r in served if is_refusal(r.text)]
    if refused:
        share = _share(refused, served)
        out.append(Finding("outputs.refusals", "warning" if share > refusal_warn else "info", name,
                           f"{share:.0%} of outputs refuse the request", _ids(refused),
                           {"count": len(refused), "share": share,
                            "examples": {r.id: r.text[:120] for r in refused[:MAX_LISTED]}},
                           "review the refused prompts: over-refusal, or requests the service should not take"))
    out += _schema(name, [r for r in served if r.expected_schema is not None])
    return out


def _summary(name: str, recs: list[OutputRecord], served: list[OutputRecord]) -> Finding:
    words = sorted(len(r.text.split()) for r in served)
    chars = sorted(len(r.text) for r in served)
    top = max(words, default=0)
    width = max(1, -(-top // 10))  # ten equal bins up to the longest
    hist = Counter(min(w // width, 9) for w in words)
    wq = _quantiles(words)
    evidence = {"records": len(recs), "finish_reasons": dict(Counter(str(r.finish_reason) for r in recs)),
                "words": wq, "chars": _quantiles(chars),
                "histogram_words": {"edges": [i * width for i in range(11)], "counts": [hist[i] for i in range(10)]}}
    return Finding("outputs.summary", "info", name,
                   f"{len(recs)} outputs; median {wq.get('p50', 0)} words, p90 {wq.get('p90', 0)}", evidence=evidence)


def _schema(name: str, recs: list[OutputRecord]) -> list[Finding]:
    if not recs:
        return []
    from jsonschema import validators
    from jsonschema.exceptions import SchemaError

    invalid: dict[str, str] = {}
    bad_schema: list[OutputRecord] = []
    for r in recs:
        schema = r.expected_schema or {}
        try:
            cls = validators.validator_for(schema)
            cls.check_schema(schema)
        except SchemaError as exc:
            bad_schema.append(r)
            invalid.setdefault(r.id, f"the schema itself is invalid: {exc.message}")
            continue
        try:
            value = json.loads(r.text)
        except json.JSONDecodeError as exc:
            invalid[r.id] = f"not JSON: {exc.msg}" + (" (cut at the token cap)" if r.finish_reason == "length" else "")
            continue
        error = next(iter(cls(schema).iter_errors(value)), None)
        if error is not None:
            where = "/".join(str(p) for p in error.absolute_path) or "(root)"
            invalid[r.id] = f"{where}: {error.message}"[:200]
    rate = 1 - len(invalid) / len(recs)
    out = [Finding("outputs.schema", "warning" if invalid else "info", name,
                   f"{rate:.0%} of {len(recs)} outputs match their JSON schema",
                   tuple(invalid), {"checked": len(recs), "valid_rate": round(rate, 4), "invalid": len(invalid),
                                    "reasons": dict(list(invalid.items())[:MAX_LISTED])},
                   "constrain decoding with the schema (response_format json_schema) or fix the prompt"
                   if invalid else "")]
    if bad_schema:
        out.append(Finding("outputs.bad_schema", "warning", name,
                           f"{len(bad_schema)} requests carry an invalid JSON schema",
                           _ids(bad_schema), {"count": len(bad_schema)}, "fix the schema the client sends"))
    return out


def _ids(recs: Sequence[OutputRecord]) -> tuple[str, ...]:
    return tuple(r.id for r in recs)


def _share(part: Sequence[Any], whole: Sequence[Any]) -> float:
    return round(len(part) / len(whole), 4) if whole else 0.0


def _quantiles(xs: list[int]) -> dict[str, float]:
    if not xs:
        return {}
    def at(q: float) -> int:  # xs is sorted
        return xs[min(len(xs) - 1, int(q * len(xs)))]

    return {"mean": round(sum(xs) / len(xs), 2), "p50": at(0.5), "p90": at(0.9), "p99": at(0.99), "max": xs[-1]}


# -- loaders ----------------------------------------------------------------------------------------------
def _expected_schema(body: dict[str, Any]) -> dict[str, Any] | None:
    """The schema a request asked its output to follow: response_format json_schema / json_object,
    or the guided_json extension."""
    fmt = body.get("response_format")
    if isinstance(fmt, dict):
        if fmt.get("type") == "json_schema":
            spec = fmt.get("json_schema")
            schema = spec.get("schema") if isinstance(spec, dict) else None
            return schema if isinstance(schema, dict) else {}
        if fmt.get("type") == "json_object":
            return {"type": "object"}
    guided = body.get("guided_json")
    return guided if isinstance(guided, dict) else None


def _choice_text(choice: dict[str, Any]) -> str:
    if "message" in choice:
        msg = choice.get("message") or {}
        if msg.get("content"):
            return str(msg["content"])
        calls = msg.get("tool_calls")
        return json.dumps(calls, ensure_ascii=False) if calls else ""
    return str(choice.get("text") or "")


def records_from_batch(output_file: str | Path, input_file: str | Path | None = None) -> list[OutputRecord]:
    """Records of a batch output (or error) JSONL file: one per choice; a line that failed (no
    response, or a non-2xx status) or cannot be read is one record with finish_reason "error"."""
    schemas: dict[str, dict[str, Any] | None] = {}
    if input_file is not None:
        for obj in _jsonl(Path(input_file)):
            if isinstance(obj, dict) and isinstance(obj.get("body"), dict) and isinstance(obj.get("custom_id"), str):
                schemas[obj["custom_id"]] = _expected_schema(obj["body"])
    out = []
    for no, obj in enumerate(_jsonl(Path(output_file)), start=1):
        if not isinstance(obj, dict):
            out.append(OutputRecord(f"line{no}", "", None, "error"))
            continue
        raw_id = obj.get("custom_id")
        cid = raw_id if isinstance(raw_id, str) and raw_id else f"line{no}"
        resp = obj.get("response")
        body = resp.get("body") if isinstance(resp, dict) else None
        status = resp.get("status_code") if isinstance(resp, dict) else None
        choices = body.get("choices") if isinstance(body, dict) else None
        if not isinstance(status, int) or not 200 <= status < 300 or not isinstance(choices, list) or not choices:
            out.append(OutputRecord(cid, "", schemas.get(cid), "error"))
            continue
        for i, ch in enumerate(c for c in choices if isinstance(c, dict)):
            out.append(OutputRecord(cid if i == 0 else f"{cid}#{i}", _choice_text(ch), schemas.get(cid),
                                    ch.get("finish_reason")))
    return out


def _jsonl(path: Path) -> list[Any]:
    """Parsed lines (None for one that is not JSON); blank lines skipped. Split on "\\n" only, as the
    batch writer does: U+2028 may stand raw inside a JSON string."""
    rows: list[Any] = []
    for raw in path.read_text(encoding="utf-8").split("\n"):
        if raw.strip():
            try:
                rows.append(json.loads(raw))
            except ValueError:
                rows.append(None)
    return rows


def _runs_and_projects(engine: Any) -> tuple[Any, Any]:
    import sqlalchemy as sa

    try:
        runs = sa.Table("runs", sa.MetaData(), autoload_with=engine, resolve_fks=False)
        projects = sa.Table("projects", sa.MetaData(), autoload_with=engine)
    except sa.exc.NoSuchTableError:
        return None, None
    return runs, projects


def _without_no_training_projects(engine: Any, q: Any, steps: Any, runs: Any, projects: Any,
                                  run_ids: Sequence[str] | None, project: str | None) -> Any:
    """The project data policy (store/data_policy.py; read by name, like the journal): a project whose data is
    never for training is refused when named (by project or by one of its runs), and its runs are left out of
    every other read. What this loader returns is what an export of served outputs contains."""
    import sqlalchemy as sa

    if runs is None or projects is None or "training_allowed" not in projects.c:
        return q
    with engine.connect() as conn:
        barred = dict(conn.execute(sa.select(projects.c.id, projects.c.name)
                                   .where(projects.c.training_allowed == sa.false())).all())
        if not barred:
            return q
        if project is not None and project in barred.values():
            raise ValueError(f"project {project!r} has a data policy that its data is never used for training: "
                             "its outputs are not exported (mainspring projects set <project> --training allows it)")
        if run_ids is not None:
            named = conn.execute(sa.select(runs.c.id, runs.c.project_id)
                                 .where(runs.c.id.in_(list(run_ids)), runs.c.project_id.in_(list(barred)))).first()
            if named is not None:
                raise ValueError(f"run {named[0]} belongs to project {barred[named[1]]!r}, whose data is never used "
                                 "for training: its outputs are not exported")
    return q.where(steps.c.run_id.not_in(sa.select(runs.c.id).where(runs.c.project_id.in_(list(barred)))))


def records_from_agent_runs(db: Any, *, run_ids: Sequence[str] | None = None, project: str | None = None,
                            limit: int | None = None) -> list[OutputRecord]:
    """Records of the agent journal's model steps (`db`: a SQLAlchemy Engine or URL), oldest first:
    completed steps with the assistant's text (its tool calls as JSON when it only called tools),
    failed steps as finish_reason "error"; only `project`'s runs when it is given (a project name).
    Read only; ValueError if there is no journal or no such project."""
    import sqlalchemy as sa

    if isinstance(db, str):
        url = sa.engine.make_url(db)
        if url.get_backend_name() == "sqlite" and url.database and not Path(url.database).expanduser().is_file():
            raise ValueError(f"no agent journal: {url.database} does not exist")  # connecting would create it
    engine = sa.create_engine(db) if isinstance(db, str) else db
    try:
        try:  # the steps' foreign keys name the runs table: not needed to read steps
            steps = sa.Table("steps", sa.MetaData(), autoload_with=engine, resolve_fks=False)
        except sa.exc.NoSuchTableError:
            raise ValueError("no agent journal in this database (no `steps` table)") from None
        q = sa.select(steps.c.id, steps.c.status, steps.c.output_json).where(steps.c.kind == "model")
        if run_ids is not None:
            q = q.where(steps.c.run_id.in_(list(run_ids)))
        runs, projects = _runs_and_projects(engine)
        if project is not None:
            if runs is None or projects is None:
                raise ValueError("no `runs` or `projects` table: this database has no projects")
            with engine.connect() as conn:
                pid = conn.execute(sa.select(projects.c.id).where(projects.c.name == project)).scalar()
            if pid is None:
                raise ValueError(f"no project named {project!r} in this database")
            q = q.where(steps.c.run_id.in_(sa.select(runs.c.id).where(runs.c.project_id == pid)))
        q = _without_no_training_projects(engine, q, steps, runs, projects, run_ids, project)
        q = q.order_by(steps.c.started_at, steps.c.seq)
        if limit is not None:
            q = q.limit(limit)
        with engine.connect() as conn:
            rows = conn.execute(q).all()
    finally:
        if isinstance(db, str):
            engine.dispose()
    out = []
    for step_id, status, output_json in rows:
        if status == "failed":
            out.append(OutputRecord(step_id, "", None, "error"))
        elif status == "completed":
            try:
                msg = json.loads(output_json or "{}")
            except ValueError:
                msg = {}
            msg = msg if isinstance(msg, dict) else {}
            reason = "tool_calls" if msg.get("tool_calls") else "stop"
            out.append(OutputRecord(step_id, _choice_text({"message": msg}), None, reason))
    return out

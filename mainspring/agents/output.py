"""A run's final answer against its agent's `output_schema`: checked, made canonical, or asked for once more.

An agent with an output schema ends with JSON meeting it, and the run's result is that value's canonical JSON
text (sorted keys, no spaces), so a downstream task reads exactly the bytes a hash was taken of. A final answer
that is not such JSON gets ONE more model call, the "finalize" step: no tools, the schema as `response_format`
(the embedded engine's constrained decoding then produces nothing else, short of a max_tokens cut) and an
instruction naming the violation. If that answer fails too (an upstream that ignores response_format), the run
fails: invalid_output. A call that offers no tools anyway (an agent without tools, the wrap-up at the step
limit) is constrained from the start.

The finalize step needs no state of its own: it follows from the journal alone, as WRAP_UP does. A completed
model step without tool calls in a run that is still going can only be a refused final answer (an accepted one
ends the run in the same transaction), and its content checked again gives the same error, hence the same
prompt and input hash, in a fresh loop, a resumed one or one recovered after kill -9. (An `output.refused`
event and audit entry say why the step follows; they are records, never read back.)
"""

from __future__ import annotations

import json
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError, best_match

from mainspring.agents.journal import RunState
from mainspring.agents.status import RunStatus
from mainspring.agents.writes import Batch

INVALID_OUTPUT = "invalid_output"


def schema_of(state: RunState) -> dict | None:
    """The schema a run's final answer must meet: the one place the loop and this module read it from."""
    return state.spec.output_schema


def canonical_json(value: Any) -> str:
    """The one text of a JSON value: equal values give equal bytes (and hashes)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def response_format(schema: dict) -> dict:
    """The OpenAI `response_format` that constrains an answer to `schema`."""
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}


def _where(error: ValidationError) -> str:
    return "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)


def _no_constant(name: str) -> Any:
    # json.loads reads NaN / Infinity, which no JSON parser downstream would read back from the canonical text
    raise ValueError(f"{name} is not a JSON value")


def check(schema: dict, text: str) -> tuple[str | None, str | None]:
    """(canonical JSON, None) when `text` is one JSON value meeting `schema`, else (None, what is wrong)."""
    if not text.strip():
        return None, "the answer is empty, not JSON"
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        return None, f"the answer is not JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
    except ValueError as exc:
        return None, f"the answer is not JSON ({exc})"
    error = best_match(Draft202012Validator(schema).iter_errors(value))
    if error is not None:
        return None, f"at {_where(error)}: {error.message}"
    return canonical_json(value), None


def refused_answer(state: RunState) -> str | None:
    """What is wrong with the run's last answer when it was a final answer that the schema refused (the next
    model step is then the finalize one), else None."""
    schema = schema_of(state)
    if schema is None:
        return None
    last = next((st for st in reversed(state.steps) if st.kind == "model"), None)
    if last is None or state.calls.get(last.id) or last.output_json is None:
        return None
    return check(schema, json.loads(last.output_json).get("content") or "")[1]


def finalize_message(state: RunState, error: str) -> dict:
    """The finalize step's instruction. The schema is spelled out for a model that does not read response_format."""
    schema = schema_of(state) or {}  # set: only a schema refuses an answer
    return {"role": "user", "content": f"Your previous answer does not meet the required output schema: {error}. "
                                       "Answer again with only a JSON value that meets this JSON Schema, calling no "
                                       f"tool: {canonical_json(schema)}"}


def note_finalize(batch: Batch, state: RunState, error: str) -> None:
    """Why a finalize step follows (the steps alone do not say): committed with the step's start, first attempt."""
    seq = next(st.seq for st in reversed(state.steps) if st.kind == "model")
    batch.event("output.refused", seq=seq, error=error)
    batch.audit("output.refused", {"seq": seq, "error": error})


def ending(state: RunState, text: str, wrap_up: bool, finalizing: bool) -> tuple[RunStatus, dict] | None:
    """How a final answer `text` ends the run: (status, finish_run's keywords), or None when the schema refused it
    and the finalize step is next. It is not when this was the finalize step, or the step limit leaves no room
    (the wrap-up call is already constrained, so one more call would be the same call)."""
    schema = schema_of(state)
    stop_reason = "max_steps" if wrap_up else "final_answer"
    if schema is None:
        return RunStatus.SUCCEEDED, {"result": text, "stop_reason": stop_reason}
    result, error = check(schema, text)
    if error is None:
        return RunStatus.SUCCEEDED, {"result": result, "stop_reason": stop_reason}
    if finalizing or state.run.step_count >= state.spec.limits.max_steps:
        return RunStatus.FAILED, {"error": f"the final answer does not meet the agent's output_schema: {error}",
                                  "stop_reason": INVALID_OUTPUT}
    return None

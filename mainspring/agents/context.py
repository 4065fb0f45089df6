"""The model's view of a run, rebuilt from the journal: stable prefix, optional summary, recent steps.

The prefix (instructions + goal) is byte-identical on every step, so prompt caching keeps hitting. When the
history outgrows `context_tokens`, older steps are folded into one extractive summary (deterministic, no
model call, so compaction itself cannot fail or cost); the journal keeps every step in full.
"""

from __future__ import annotations

import hashlib
import json

from mainspring.agents.audit import canonical
from mainspring.agents.journal import RunState
from mainspring.agents.tables import StepRow

CHARS_PER_TOKEN = 4  # estimate for deciding when to compact; real counts come back in usage
SUMMARY_ITEM_CHARS = 240


def prefix(state: RunState) -> list[dict]:
    return [{"role": "system", "content": state.spec.instructions}, {"role": "user", "content": state.run.goal}]


def _step_messages(state: RunState, step: StepRow) -> list[dict]:
    message = json.loads(step.output_json)
    out = [message]
    for call in state.calls.get(step.id, []):
        if call.result_json is not None and call.status in ("completed", "failed", "rejected"):
            out.append({"role": "tool", "tool_call_id": call.id, "content": json.loads(call.result_json)["content"]})
    return out


def _latest_compaction(state: RunState) -> tuple[str, int] | None:
    for step in reversed(state.steps):
        if step.kind == "compaction":
            data = json.loads(step.output_json)
            return data["summary"], data["through_seq"]
    return None


def build_messages(state: RunState) -> list[dict]:
    messages = prefix(state)
    compaction = _latest_compaction(state)
    through = 0
    if compaction:
        summary, through = compaction
        messages.append({"role": "user", "content": summary})
    for step in state.steps:
        if step.kind == "model" and step.seq > through:
            messages.extend(_step_messages(state, step))
    return messages


def estimate_tokens(messages: list[dict]) -> int:
    return len(canonical(messages)) // CHARS_PER_TOKEN


def needs_compaction(state: RunState, messages: list[dict]) -> bool:
    compaction = _latest_compaction(state)
    through = compaction[1] if compaction else 0
    live = [s for s in state.steps if s.kind == "model" and s.seq > through]
    return (estimate_tokens(messages) > state.spec.limits.context_tokens
            and len(live) > state.spec.limits.keep_recent_steps)


def summarize(state: RunState) -> tuple[str, int]:
    """(summary text, seq of the last step it covers): everything but the most recent steps."""
    compaction = _latest_compaction(state)
    previous, through = compaction if compaction else ("", 0)
    live = [s for s in state.steps if s.kind == "model" and s.seq > through]
    fold = live[:-state.spec.limits.keep_recent_steps]
    lines = [previous] if previous else ["Summary of earlier steps (full record in the run's journal):"]
    for step in fold:
        message = json.loads(step.output_json)
        if message.get("content"):
            lines.append(f"- step {step.seq}: said: {_clip(message['content'])}")
        for call in state.calls.get(step.id, []):
            result = json.loads(call.result_json)["content"] if call.result_json else "(no result)"
            lines.append(f"- step {step.seq}: {call.name}({_clip(call.arguments_json)}) -> {_clip(result)}")
    return "\n".join(lines), fold[-1].seq


def _clip(text: str) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= SUMMARY_ITEM_CHARS else text[:SUMMARY_ITEM_CHARS] + "…"


def input_hash(messages: list[dict], tools: list[dict]) -> str:
    return hashlib.sha256(canonical({"messages": messages, "tools": tools}).encode()).hexdigest()

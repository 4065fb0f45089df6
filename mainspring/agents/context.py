"""The model's view of a run, rebuilt from the journal: stable prefix, optional summary, recent steps.

The prefix (instructions + goal) is byte-identical on every step, so prompt caching keeps hitting. When the
history outgrows `context_tokens`, older steps are folded into one extractive summary (deterministic, no
model call, so compaction itself cannot fail or cost); the journal keeps every step in full.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from mainspring.agents.audit import canonical
from mainspring.agents.journal import RunState
from mainspring.agents.status import ANSWERED_CALLS, OPEN_CALLS

CHARS_PER_TOKEN = 4  # estimate for deciding when to compact; real counts come back in usage
SUMMARY_ITEM_CHARS = 240


@dataclass
class Prompt:
    """The messages of one model call, each with its canonical JSON: the size estimate and the input hash are
    computed from these parts, so a step does not serialise the whole history again. Message dicts are
    shared from step to step (see _Settled): read-only for whoever receives them."""
    messages: list[dict]
    parts: list[str]

    def add(self, message: dict) -> None:
        self.messages.append(message)
        self.parts.append(canonical(message))

    def plus(self, message: dict) -> Prompt:
        out = Prompt(list(self.messages), list(self.parts))
        out.add(message)
        return out

    def tokens(self) -> int:
        # len(canonical(messages)): "[" + ",".join(parts) + "]", as json.dumps writes a list
        return (2 + sum(map(len, self.parts)) + max(len(self.parts) - 1, 0)) // CHARS_PER_TOKEN

    def input_hash(self, tools: list[dict]) -> str:
        """input_hash(messages, tools), from the parts: canonical() sorts "messages" before "tools"."""
        h = hashlib.sha256(b'{"messages":[')
        h.update(",".join(self.parts).encode())
        h.update(b'],"tools":')
        h.update(canonical(tools).encode())
        h.update(b"}")
        return h.hexdigest()


@dataclass
class _Settled:
    """The prompt's part that no later step changes: prefix, summary, and the messages of state.steps[:upto]
    (each completed, its calls all finished). Kept on the RunState, so a step only adds what is new instead
    of parsing and serialising the whole history again."""
    upto: int
    through: int  # seq that the latest compaction covers, 0 without one
    prompt: Prompt


def prefix(state: RunState) -> list[dict]:
    return [{"role": "system", "content": state.spec.instructions}, {"role": "user", "content": state.run.goal}]


def _latest_compaction(state: RunState) -> tuple[str, int] | None:
    for step in reversed(state.steps):
        if step.kind == "compaction":
            assert step.output_json is not None  # a compaction is journaled with its summary
            data = json.loads(step.output_json)
            return data["summary"], data["through_seq"]
    return None


def _settled_base(state: RunState) -> _Settled:
    prompt = Prompt([], [])
    for message in prefix(state):
        prompt.add(message)
    compaction = _latest_compaction(state)
    through = 0
    if compaction:
        summary, through = compaction
        prompt.add({"role": "user", "content": summary})
    return _Settled(0, through, prompt)


def _add_step(prompt: Prompt, state: RunState, step) -> None:
    prompt.add(json.loads(step.output_json))
    for call in state.calls.get(step.id, []):
        if call.result_json is not None and call.status in ANSWERED_CALLS:
            prompt.add({"role": "tool", "tool_call_id": call.id, "content": json.loads(call.result_json)["content"]})


def build_prompt(state: RunState) -> Prompt:
    steps, settled = state.steps, state.prompt_cache
    if settled is None or any(st.kind == "compaction" for st in steps[settled.upto:]):
        settled = state.prompt_cache = _settled_base(state)  # first build, or a new summary: from the start
    while settled.upto < len(steps):  # settle what has finished since
        step = steps[settled.upto]
        if step.kind == "model" and step.seq > settled.through:
            if any(c.status in OPEN_CALLS for c in state.calls.get(step.id, [])):
                break
            _add_step(settled.prompt, state, step)
        settled.upto += 1
    prompt = Prompt(list(settled.prompt.messages), list(settled.prompt.parts))
    for step in steps[settled.upto:]:
        if step.kind == "model" and step.seq > settled.through:
            _add_step(prompt, state, step)
    return prompt


def build_messages(state: RunState) -> list[dict]:
    return build_prompt(state).messages


def estimate_tokens(messages: list[dict]) -> int:
    return len(canonical(messages)) // CHARS_PER_TOKEN


def needs_compaction(state: RunState, prompt: Prompt) -> bool:
    if prompt.tokens() <= state.spec.limits.context_tokens:
        return False
    compaction = _latest_compaction(state)
    through = compaction[1] if compaction else 0
    live = [s for s in state.steps if s.kind == "model" and s.seq > through]
    return len(live) > state.spec.limits.keep_recent_steps


def summarize(state: RunState) -> tuple[str, int]:
    """(summary text, seq of the last step it covers): everything but the most recent steps."""
    compaction = _latest_compaction(state)
    previous, through = compaction if compaction else ("", 0)
    live = [s for s in state.steps if s.kind == "model" and s.seq > through]
    fold = live[:-state.spec.limits.keep_recent_steps]
    lines = [previous] if previous else ["Summary of earlier steps (full record in the run's journal):"]
    for step in fold:
        assert step.output_json is not None  # folded steps are older than the recent ones: all finished
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

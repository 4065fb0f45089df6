"""The design dialogue: a thread of user turns over one scene, keeping what was agreed.

Thread state = the conversation, the current scene and the pinned constraints (every constraint
agreed so far, with the turn that agreed it). A user turn ("make the table longer, keep the
chairs where they are") becomes one model answer {"patch": [...], "constraints": [...]}: the
edit as a JSON Patch (which may also add or remove objects) and the constraints the request
adds or changes. A constraint with the type and objects of a pinned one replaces it (changed);
any other is pinned as new. The caller may pin constraints of its own with the turn.

After every turn all pinned constraints are re-checked. One that passed before the turn and
fails after it is reported as broken by the edit, and repair rounds (refine.revise, with the
pinned list as the target) try to restore it. The edit itself is applied even when it breaks
something (it is what the user asked for); what is never accepted silently is the breakage.

`DesignThread.to_state()` is the thread as JSON and `DesignThread.from_state()` reads it back, so a
thread can be stored between turns (the API's scene threads): the next turn continues it exactly.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Sequence

from pydantic import TypeAdapter, ValidationError

from mainspring.models.base import ChatModel, Message
from mainspring.scenarios.scene3d.evaluate import BriefScore, constraint_refs
from mainspring.scenarios.scene3d.refine import (RefineConfig, Render, Round, Spend, Target, call, first_messages,
                                                 patch_format, revise, scene_format)
from mainspring.scenes.checks.result import label
from mainspring.scenes.constraint_model import Constraint
from mainspring.scenes.patch import PatchError, apply_patch, dumps
from mainspring.scenes.schema import decoding_schema

_CONSTRAINT = TypeAdapter(Constraint)

TURN_RULES = (
    "Answer {\"patch\":[operations],\"constraints\":[...]}: the edit as a JSON Patch (RFC 6902; replace a "
    "value by its pointer, add an object at /objects/-, remove /objects/INDEX), and the constraints this "
    "request adds or changes (none if it adds none). Keep every agreed constraint true."
)


@dataclass(frozen=True)
class Pinned:
    constraint: Any  # a scene constraint model (mainspring.scenes.constraint_model)
    turn: int  # the turn that agreed it (0 = the opening request)

    @property
    def key(self) -> tuple:
        """What identifies an agreement: a later constraint with the same key changes it."""
        c = self.constraint
        return (c.type, getattr(c, "a", None), getattr(c, "b", None), str(getattr(c, "ids", None)))

    @property
    def label(self) -> str:
        return label(self.constraint)


@dataclass
class TurnResult:
    turn: int
    request: str
    rounds: list[Round]
    edit_error: str | None = None  # why the edit was not applied
    added: list[str] = field(default_factory=list)  # labels pinned as new this turn
    changed: list[str] = field(default_factory=list)  # labels whose pinned form this turn replaced
    rejected: list[str] = field(default_factory=list)  # the answer's constraints not pinned: unreadable, contradicting
    broken: list[str] = field(default_factory=list)  # pinned labels that passed before the edit and fail after it
    score: BriefScore | None = None  # every pinned constraint on the scene at the end of the turn
    stop_reason: str = ""

    @property
    def failing(self) -> list[str]:
        return [r.label for r in self.score.results if not r.passed] if self.score else []

    @property
    def repaired(self) -> bool:
        """Whatever the edit broke holds again at the end of the turn."""
        return not (set(self.broken) & set(self.failing))

    def to_dict(self) -> dict[str, Any]:
        return {"turn": self.turn, "request": self.request, "edit_error": self.edit_error, "added": self.added,
                "changed": self.changed, "rejected": self.rejected, "broken": self.broken,
                "repaired": self.repaired, "failing": self.failing, "stop_reason": self.stop_reason,
                "rounds": [r.to_dict() for r in self.rounds]}


@dataclass(frozen=True)
class StoredTurn:
    """A turn of a thread read back from its state: its report as it was made. The rounds' scores are
    not kept (nor the scenes they measured); the next turn needs only how many turns came before."""

    record: dict[str, Any]

    @property
    def turn(self) -> int:
        return int(self.record["turn"])

    def to_dict(self) -> dict[str, Any]:
        return dict(self.record)


STATE_VERSION = 1  # of to_state's layout; from_state refuses any other


@dataclass
class DesignThread:
    messages: list[Message]
    doc: dict[str, Any] | None
    pinned: list[Pinned]
    config: RefineConfig
    spend: Spend
    turns: list[TurnResult | StoredTurn] = field(default_factory=list)

    def object_ids(self) -> list[str]:
        return [o["id"] for o in (self.doc or {}).get("objects", []) if isinstance(o, dict) and "id" in o]

    def target(self) -> Target:
        required = list(dict.fromkeys(oid for p in self.pinned for oid in constraint_refs(p.constraint)))
        return Target("design", required, [p.constraint for p in self.pinned])

    def pin(self, constraints: Sequence[Any], turn: int, rejected: list[str] | None = None,
            user: bool = True) -> tuple[list[str], list[str]]:
        """Pin `constraints`: (labels added, labels changed). One that contradicts a pinned
        constraint replaces it when the user gave it; from the model it is not pinned but listed
        in `rejected` (a model does not overrule an agreement)."""
        added, changed = [], []
        for c in constraints:
            new = Pinned(c, turn)
            clash = next((i for i, p in enumerate(self.pinned) if contradicts(c, p.constraint)), None)
            if clash is not None and not user:
                if rejected is not None:
                    rejected.append(f"{new.label}: contradicts {self.pinned[clash].label}, agreed in turn "
                                    f"{self.pinned[clash].turn}")
                continue
            if clash is not None:
                self.pinned[clash] = new
                changed.append(new.label)
                continue
            at = next((i for i, p in enumerate(self.pinned) if p.key == new.key), None)
            if at is None:
                self.pinned.append(new)
                added.append(new.label)
            elif self.pinned[at].constraint != c:
                self.pinned[at] = new
                changed.append(new.label)
        return added, changed

    def to_dict(self) -> dict[str, Any]:
        return {"doc": self.doc, "pinned": [{"constraint": p.constraint.model_dump(), "turn": p.turn}
                                            for p in self.pinned],
                "turns": [t.to_dict() for t in self.turns], "tokens": self.spend.to_dict()}

    def to_state(self) -> dict[str, Any]:
        """Everything the next turn needs, as JSON: the conversation (the prompt only grows at its end,
        so a prefix cache still serves it after a restore), the scene, the agreements with their turns,
        the loop's settings, the spend against the budget and every turn's report."""
        spend = self.spend
        return {"version": STATE_VERSION, "messages": self.messages, "doc": self.doc,
                "pinned": [{"constraint": p.constraint.model_dump(mode="json"), "turn": p.turn} for p in self.pinned],
                "config": asdict(self.config),
                "spend": {"budget": spend.budget, "prompt_tokens": spend.prompt_tokens,
                          "cached_tokens": spend.cached_tokens, "completion_tokens": spend.completion_tokens},
                "turns": [t.to_dict() for t in self.turns]}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> DesignThread:
        """The thread `to_state` wrote. Settings RefineConfig no longer has are dropped and new ones take
        their defaults, so a stored thread outlives a change of the loop's settings."""
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"a design thread's state of version {state.get('version')!r}, not {STATE_VERSION}")
        known = {f.name for f in fields(RefineConfig)}
        config = RefineConfig(**{k: v for k, v in state["config"].items() if k in known})
        pinned = [Pinned(_CONSTRAINT.validate_python(p["constraint"]), int(p["turn"])) for p in state["pinned"]]
        turns: list[TurnResult | StoredTurn] = [StoredTurn(t) for t in state["turns"]]
        return cls(list(state["messages"]), state["doc"], pinned, config, Spend(**state["spend"]), turns)


_OPPOSITE = {"above": "below", "below": "above", "left_of": "right_of", "right_of": "left_of",
             "in_front_of": "behind", "behind": "in_front_of"}
_ONE_WAY = ("on_top_of", "supported_by", *_OPPOSITE)  # a r b and b r a cannot both hold


def contradicts(new: Any, old: Any) -> bool:
    """Whether `new` cannot hold together with `old`: a one-way relation turned around
    (on_top_of(table, cup) after on_top_of(cup, table)), its opposite between the same objects
    (below after above), or near/far bounds that leave no distance."""
    a, b = getattr(new, "a", None), getattr(new, "b", None)
    oa, ob = getattr(old, "a", None), getattr(old, "b", None)
    if a is None or b is None or oa is None or ob is None:
        return False
    same, swapped = (a, b) == (oa, ob), (a, b) == (ob, oa)
    if new.type == old.type and new.type in _ONE_WAY and swapped:
        return True
    if _OPPOSITE.get(new.type) == old.type and same:
        return True
    if {new.type, old.type} == {"near", "far"} and (same or swapped):
        near, far = (new, old) if new.type == "near" else (old, new)
        return bool(far.min > near.max)
    return False


def parse_constraints(values: Any) -> tuple[list[Any], list[str]]:
    """Constraint models from JSON values, and a message per value that is not one."""
    ok, bad = [], []
    for v in values if isinstance(values, list) else []:
        try:
            ok.append(_CONSTRAINT.validate_python(v))
        except ValidationError as exc:
            bad.append(f"{_shown(v)}: {exc.errors()[0]['msg']}")
    return ok, bad


def _shown(value: Any) -> str:
    """`value` as JSON, or as Python where JSON cannot say it: an HTTP body's NaN (Python's JSON parser
    reads it) must be reported as bad input, not fail the report."""
    try:
        return dumps(value)
    except ValueError:
        return repr(value)


def turn_format(doc: dict[str, Any], config: RefineConfig) -> dict[str, Any]:
    """The answer of a turn: a structural patch of `doc` and constraints over its ids."""
    ids = [o["id"] for o in doc.get("objects", []) if isinstance(o, dict) and "id" in o]
    scene = decoding_schema(ids or None)
    defs = scene["$defs"]
    shapes = [name for name in ("Box", "Sphere", "Cylinder", "Capsule", "Torus", "Plane") if name in defs]
    extra = {"properties": {"constraints": scene["properties"]["constraints"]}, "required": ["constraints"],
             "$defs": defs}
    fmt = patch_format(doc, config.max_ops, structural=True, extra=extra)
    fmt["json_schema"]["schema"]["properties"]["patch"]["items"]["anyOf"][-1]["properties"]["value"] = {
        "anyOf": [{"$ref": f"#/$defs/{name}"} for name in shapes]}
    fmt["json_schema"]["name"] = "scene_edit"
    return fmt


def _turn_request(thread: DesignThread, text: str) -> str:
    agreed = ", ".join(p.label for p in thread.pinned) or "none yet"
    return f"{text}\nAgreed constraints: {agreed}.\nThe scene now: {dumps(thread.doc)}\n{TURN_RULES}"


async def _check_and_repair(model: ChatModel, thread: DesignThread, result: TurnResult, before: set[str],
                            render: Render | None) -> None:
    target = thread.target()
    score = target.score(thread.doc)
    result.broken = [r.label for r in score.results if r.label in before and not r.passed]
    if thread.doc is not None:
        thread.doc, score, result.stop_reason = await revise(model, thread.messages, thread.doc, score, target,
                                                             thread.config, thread.spend, result.rounds, render)
    result.score = score


def _passing(thread: DesignThread) -> set[str]:
    if thread.doc is None or not thread.pinned:
        return set()
    return {r.label for r in thread.target().score(thread.doc).results if r.passed}


async def start_thread(model: ChatModel, request: str, object_ids: Sequence[str], constraints: Sequence[Any] = (),
                       config: RefineConfig | None = None, render: Render | None = None) -> DesignThread:
    """Open a thread: the first scene for `request` (exactly `object_ids`), `constraints` pinned
    as turn 0's agreement and repaired towards."""
    config = config or RefineConfig()
    thread = DesignThread(first_messages(request), None, [], config, Spend(config.token_budget))
    result = TurnResult(0, request, [])
    result.added, _ = thread.pin(constraints, 0)
    first = await call(model, thread.messages, scene_format(object_ids), config.scene_max_tokens, config,
                       thread.spend, 0, "write")
    result.rounds.append(first)
    try:
        doc = json.loads(first.text)
        thread.doc = doc if isinstance(doc, dict) else None
    except ValueError as exc:
        result.edit_error = first.error = f"the scene is not JSON: {exc}"
    first.applied = thread.doc is not None
    first.score = thread.target().score(thread.doc if thread.doc is not None else first.text)
    await _check_and_repair(model, thread, result, set(), render)
    thread.turns.append(result)
    return thread


async def user_turn(model: ChatModel, thread: DesignThread, text: str, constraints: Sequence[Any] = (),
                    render: Render | None = None) -> TurnResult:
    """One user turn: the model's edit and constraints, the caller's `constraints`, then every
    pinned constraint re-checked and what the edit broke repaired."""
    n = len(thread.turns)
    result = TurnResult(n, text, [])
    if thread.doc is None:
        result.edit_error = "there is no scene to edit"
        thread.turns.append(result)
        return result
    before = _passing(thread)
    thread.messages.append({"role": "user", "content": _turn_request(thread, text)})
    # an edit may carry whole new objects and constraints: twice a repair's room
    edit = await call(model, thread.messages, turn_format(thread.doc, thread.config),
                      thread.config.patch_max_tokens * 2, thread.config, thread.spend, 0, "edit")
    result.rounds.append(edit)
    try:
        answer = json.loads(edit.text)
        if not isinstance(answer, dict):
            raise ValueError("not an object")
        edited = apply_patch(thread.doc, answer.get("patch", []))
        problems = [f"{v.path}: {v.message}" for v in Target("edit", [], []).score(edited).violations]
        if problems:
            raise PatchError(f"it makes the scene invalid ({'; '.join(problems[:6])})")
        thread.doc, edit.patch, edit.applied = edited, answer.get("patch"), True
        new, result.rejected = parse_constraints(answer.get("constraints"))
    except (ValueError, PatchError) as exc:  # PatchError is a ValueError; said apart for the reader
        result.edit_error = edit.error = f"the edit was not applied: {exc}"
        new = []
    added, changed = thread.pin(new, n, result.rejected, user=False)
    user_added, user_changed = thread.pin(constraints, n)
    result.added, result.changed = added + user_added, changed + user_changed
    edit.score = thread.target().score(thread.doc)
    # a changed agreement is the user's new word, not something the edit broke
    await _check_and_repair(model, thread, result, before - set(changed), render)
    thread.turns.append(result)
    return result


__all__ = ["DesignThread", "Pinned", "STATE_VERSION", "StoredTurn", "TURN_RULES", "TurnResult", "contradicts",
           "parse_constraints", "start_thread", "turn_format", "user_turn"]

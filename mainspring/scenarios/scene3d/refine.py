"""The refinement loop: write a scene (constrained decoding), check it against the brief, feed the
failures back with their measurements, and take the model's answer as a JSON Patch (constrained
to the patches the document can take), until every constraint passes, the round cap or the
token budget.

The prompt only ever grows at its end: system (format + patch rules) and the brief come first,
then the scene as written, then one (feedback, patch) pair per round. Every call's prompt is the
previous call's prompt plus what happened since, so an engine's prefix cache serves all of it
but the newest feedback. A patch that cannot be applied, or that would make the scene invalid,
is refused (the scene stays as it was) and the refusal is the next round's feedback.

A round may ask for several candidate patches at once (`candidates`): the first at the loop's own
temperature, the rest sampled, all on the same prompt (one prefill, shared through the prefix
cache, and decoded in one batch by an engine that batches). The checker is the judge: the
candidate whose scene passes the most constraints is kept, and only it joins the conversation, so
the next round's prompt is still the previous one plus what happened. Every candidate's tokens
are counted. A greedy repeat of a refused patch is the commonest way a small model wastes a round;
sampling is how it gets out.

`revise` is the repair part alone, shared with the design dialogue (dialogue.py).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from mainspring.models.base import ChatModel, Message
from mainspring.scenarios.scene3d.briefs import Brief
from mainspring.scenarios.scene3d.evaluate import BriefScore, score_constraints
from mainspring.scenarios.scene3d.feedback import check_feedback, involved_ids
from mainspring.scenarios.scene3d.generate import SYSTEM_PROMPT
from mainspring.scenarios.scene3d.repair import suggest
from mainspring.scenes.patch import PatchError, apply_patch, dumps, patch_schema
from mainspring.scenes.schema import decoding_schema

# Said with each revision request rather than in the system prompt: the first scene is then
# written from exactly the one-shot prompt (generate.py), so round 0 is the one-shot baseline.
PATCH_RULES = (
    "Revise the scene with a JSON Patch (RFC 6902), answered as {\"patch\":[operations]}. Each operation "
    "replaces one value by its JSON pointer: /objects/INDEX/position/AXIS is one coordinate (AXIS 0 = x, "
    "1 = y, 2 = z) of the object at INDEX. Change only what the failed checks are about."
)
REFINE_SYSTEM_PROMPT = SYSTEM_PROMPT

Render = Callable[[dict[str, Any]], Any]  # doc -> a tools.RenderJobResult (preview_png, report)


@dataclass(frozen=True)
class RefineConfig:
    max_rounds: int = 3  # revisions after the first scene
    token_budget: int | None = None  # prompt + completion tokens over every call; None = no limit
    scene_max_tokens: int = 512
    patch_max_tokens: int = 192
    max_ops: int = 6
    temperature: float = 0.0
    seed: int | None = 0
    candidates: int = 1  # patches asked for per revision round; the checker keeps the best
    candidate_temperature: float = 0.8  # for every candidate after the first
    repair_hints: bool = True  # quote the checker's verified repair of each failed constraint (repair.py)

    def __post_init__(self) -> None:
        if self.max_rounds < 0 or self.scene_max_tokens < 1 or self.patch_max_tokens < 1 or self.max_ops < 1:
            raise ValueError("max_rounds >= 0, max tokens and max_ops >= 1")
        if self.candidates < 1 or self.candidate_temperature < 0:
            raise ValueError("candidates >= 1 and candidate_temperature >= 0")
        if self.token_budget is not None and self.token_budget < 1:
            raise ValueError("token_budget must be positive (or None)")


@dataclass(frozen=True)
class Target:
    """What the scene must satisfy: the ids it must contain and the constraints measured on it."""

    name: str
    objects: list[str]
    constraints: list[Any]

    @classmethod
    def of(cls, brief: Brief) -> Target:
        return cls(brief.id, list(brief.objects), list(brief.constraints))

    def score(self, doc: Any) -> BriefScore:
        return score_constraints(doc, self.name, self.objects, self.constraints)


@dataclass
class Round:
    """One model call and what came of it."""

    index: int  # 0 = the first scene, then one per revision
    kind: str  # "write" | "patch" | "edit" (a design-dialogue turn)
    text: str
    finish_reason: str | None
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    applied: bool = False  # the scene changed to what this round wrote
    error: str | None = None  # why it was refused (bad JSON, bad patch, invalid result)
    patch: list[dict[str, Any]] | None = None
    score: BriefScore | None = None  # the scene's check after this round
    preview_png: bytes | None = None
    candidates: int = 1  # model answers this round weighed (its tokens are all of theirs)
    chosen: int = 0  # the one kept

    def to_dict(self) -> dict[str, Any]:
        s = self.score
        return {"index": self.index, "kind": self.kind, "finish_reason": self.finish_reason,
                "prompt_tokens": self.prompt_tokens, "cached_tokens": self.cached_tokens,
                "completion_tokens": self.completion_tokens, "applied": self.applied, "error": self.error,
                "patch": self.patch, "candidates": self.candidates, "chosen": self.chosen,
                "valid": s.valid if s else None,
                "num_passed": s.num_passed if s else None, "num_constraints": len(s.results) if s else None,
                "failed": [r.label for r in s.results if not r.passed] if s else None,
                "previewed": self.preview_png is not None}


@dataclass
class Spend:
    """Tokens spent so far over a loop or a thread, against an optional budget."""

    budget: int | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0

    @property
    def total(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @property
    def exhausted(self) -> bool:
        return self.budget is not None and self.total >= self.budget

    def add(self, usage: Any) -> None:
        self.prompt_tokens += usage.prompt_tokens
        self.cached_tokens += usage.cached_tokens
        self.completion_tokens += usage.completion_tokens

    def to_dict(self) -> dict[str, Any]:
        return {"prompt_tokens": self.prompt_tokens, "cached_tokens": self.cached_tokens,
                "completion_tokens": self.completion_tokens, "total_tokens": self.total,
                "cache_hit_rate": round(self.cached_tokens / self.prompt_tokens, 4) if self.prompt_tokens else 0.0}


@dataclass
class RefineResult:
    name: str
    doc: Any  # the final scene (None if none was ever written)
    stop_reason: str  # "passed" | "max_rounds" | "budget" | "no_scene" (none written, or nothing to patch)
    rounds: list[Round]
    spend: Spend
    messages: list[Message] = field(default_factory=list)

    @property
    def first(self) -> BriefScore | None:
        return self.rounds[0].score if self.rounds else None

    @property
    def final(self) -> BriefScore | None:
        return self.rounds[-1].score if self.rounds else None

    @property
    def passed(self) -> bool:
        return self.stop_reason == "passed"

    def to_dict(self) -> dict[str, Any]:
        first, final = self.first, self.final
        return {"name": self.name, "stop_reason": self.stop_reason, "passed": self.passed,
                "first_score": round(first.score, 4) if first else 0.0,
                "final_score": round(final.score, 4) if final else 0.0,
                "revisions": sum(r.kind == "patch" for r in self.rounds),
                "rounds": [r.to_dict() for r in self.rounds], "tokens": self.spend.to_dict()}


def scene_format(objects: Sequence[str]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "scene", "schema": decoding_schema(list(objects))}}


def patch_format(doc: dict[str, Any], max_ops: int, structural: bool = False,
                 extra: dict[str, Any] | None = None, rotations: bool = True,
                 objects: Sequence[str] | None = None, camera: bool = True,
                 remove_constraints: bool = False) -> dict[str, Any]:
    schema = patch_schema(doc, max_ops, structural, rotations=rotations, objects=objects, camera=camera,
                          remove_constraints=remove_constraints)
    if extra:
        schema["properties"].update(extra.get("properties", {}))
        schema["required"] += extra.get("required", [])
        if "$defs" in extra:
            schema["$defs"] = extra["$defs"]
    return {"type": "json_schema", "json_schema": {"name": "scene_patch", "schema": schema}}


async def call(model: ChatModel, messages: list[Message], response_format: dict[str, Any], max_tokens: int,
               config: RefineConfig, spend: Spend, index: int, kind: str) -> Round:
    """One model call, appended to `messages` as the assistant's answer and counted in `spend`."""
    done = await model.chat(messages, response_format=response_format, max_tokens=max_tokens,
                            temperature=config.temperature, seed=config.seed)
    spend.add(done.usage)
    messages.append({"role": "assistant", "content": done.text})
    return Round(index, kind, done.text, done.finish_reason, done.usage.prompt_tokens, done.usage.cached_tokens,
                 done.usage.completion_tokens)


def _rank(found: tuple[dict[str, Any] | None, list | None, str | None], target: Target) -> tuple:
    revised, _, refused = found
    if refused is not None or revised is None:
        return (0, 0, 0, 0)
    score = target.score(revised)
    return (1, int(score.valid), score.num_passed, -len(score.violations))


async def call_candidates(model: ChatModel, messages: list[Message], response_format: dict[str, Any],
                          max_tokens: int, config: RefineConfig, spend: Spend, index: int,
                          judge: Callable[[str], tuple]) -> tuple[Round, Any]:
    """`config.candidates` answers to the same prompt; the one `judge` ranks highest (ties: the
    earliest) is appended to `messages` and returned with its judgement. The round's tokens are
    every candidate's."""
    seed = None if config.seed is None else config.seed + 1000 * index
    done = await asyncio.gather(*(
        model.chat(messages, response_format=response_format, max_tokens=max_tokens,
                   temperature=config.temperature if k == 0 else config.candidate_temperature,
                   seed=None if seed is None else seed + k)
        for k in range(config.candidates)))
    judged = [judge(d.text) for d in done]
    best = max(range(len(done)), key=lambda k: (judged[k][0], -k))
    for d in done:
        spend.add(d.usage)
    messages.append({"role": "assistant", "content": done[best].text})
    r = Round(index, "patch", done[best].text, done[best].finish_reason,
              sum(d.usage.prompt_tokens for d in done), sum(d.usage.cached_tokens for d in done),
              sum(d.usage.completion_tokens for d in done), candidates=len(done), chosen=best)
    return r, judged[best][1]


def _preview(render: Render | None, doc: Any) -> bytes | None:
    if render is None:
        return None
    job = render(doc)
    return getattr(job, "preview_png", None)


def apply_answer(doc: dict[str, Any], text: str, target: Target,
                 current: BriefScore | None = None) -> tuple[dict[str, Any] | None, list | None, str | None]:
    """The scene after the patch in `text`, the patch, and why it was refused (None if it was not).
    A patch may not make a valid scene invalid, nor an invalid one worse."""
    try:
        answer = json.loads(text)
    except ValueError as exc:
        return None, None, f"your answer is not JSON ({exc}); answer {{\"patch\":[...]}}"
    try:
        patch = answer["patch"] if isinstance(answer, dict) and "patch" in answer else answer
        revised = apply_patch(doc, patch)
    except PatchError as exc:
        return None, None, f"your patch was not applied: {exc}"
    if revised == doc:  # e.g. the same patch again: a round spent on nothing, said so
        return None, patch, "your patch changes nothing: those values are already what it sets"
    score = target.score(revised)
    allowed = len(current.violations) if current is not None and not current.valid else 0
    if not score.valid and (allowed == 0 or len(score.violations) > allowed):
        problems = "; ".join(f"{v.path}: {v.message}" for v in score.violations[:6])
        return None, patch, f"your patch was not applied: it makes the scene invalid ({problems})"
    if current is not None and current.valid and score.num_passed < current.num_passed:
        # a revision that loses more than it wins is refused: the loop never ends worse than it began
        was = {r.index for r in current.results if r.passed}
        broken = [r.label for r in score.results if r.index in was and not r.passed]
        return None, patch, f"your patch was not applied: it breaks {', '.join(broken)}, which passed"
    return revised, patch, None


_VIEW_CHECKS = ("visible_in_camera", "in_frame")


def revision_scope(doc: dict[str, Any], score: BriefScore, target: Target) -> dict[str, Any]:
    """What a revision may touch: the objects the failed checks are about (their `a` first: the
    one a relation places), the camera only when a view check failed, a rotation only when a
    facing check did. An invalid scene may need anything fixed, its own constraints dropped too."""
    if not score.valid:
        return {"remove_constraints": True}
    failed = [(r, target.constraints[r.index]) for r in score.results if not r.passed]
    ids: list[str] = [oid for oid in score.missing]
    for r, c in failed:
        ids += [oid for oid in involved_ids(r, c, doc) if oid not in ids]
    return {"objects": ids or None, "camera": any(r.type in _VIEW_CHECKS for r, _ in failed),
            "rotations": any(r.type == "facing" for r, _ in failed)}


def revision_request(doc: dict[str, Any], score: BriefScore, target: Target, refused: str | None = None,
                     config: RefineConfig | None = None) -> str:
    config = config or RefineConfig()
    hints = suggest(doc, score, target, config.max_ops) if config.repair_hints else None
    parts = [refused] if refused else []
    parts += [check_feedback(doc, score, target.constraints, hints), f"The scene now: {dumps(doc)}", PATCH_RULES]
    return "\n".join(parts)


async def revise(model: ChatModel, messages: list[Message], doc: dict[str, Any], score: BriefScore,
                 target: Target, config: RefineConfig, spend: Spend, rounds: list[Round],
                 render: Render | None = None, max_rounds: int | None = None) -> tuple[dict[str, Any], BriefScore, str]:
    """Repair rounds on `messages` (which end with the model's last answer) until `target` passes,
    the round cap or the budget: the final scene, its score and why it stopped. Each round is
    appended to `rounds`."""
    refused: str | None = None
    cap = config.max_rounds if max_rounds is None else max_rounds
    for _ in range(cap):
        if score.valid and all(r.passed for r in score.results) and not score.missing:
            return doc, score, "passed"
        if spend.exhausted:
            return doc, score, "budget"
        messages.append({"role": "user", "content": revision_request(doc, score, target, refused, config)})
        try:
            fmt = patch_format(doc, config.max_ops, **revision_scope(doc, score, target))
        except PatchError:  # nothing to point at (an upstream that ignored the scene format)
            return doc, score, "no_scene"
        def judge(text: str, doc=doc, score=score) -> tuple:
            found = apply_answer(doc, text, target, score)
            return _rank(found, target), found

        r, (revised, patch, refused) = await call_candidates(model, messages, fmt, config.patch_max_tokens,
                                                              config, spend, len(rounds), judge)
        r.patch, r.error = patch, refused
        if revised is not None:
            doc, score, r.applied = revised, target.score(revised), True
            r.preview_png = _preview(render, doc)
        r.score = score
        rounds.append(r)
    if score.valid and all(r.passed for r in score.results) and not score.missing:
        return doc, score, "passed"
    return doc, score, "budget" if spend.exhausted else "max_rounds"


def first_messages(request: str, system: str = REFINE_SYSTEM_PROMPT) -> list[Message]:
    return [{"role": "system", "content": system}, {"role": "user", "content": request}]


async def refine(model: ChatModel, brief: Brief | Target, config: RefineConfig | None = None,
                 render: Render | None = None, request: str | None = None) -> RefineResult:
    """Write the brief's scene and revise it; every call and check is in the result's rounds."""
    config = config or RefineConfig()
    target = brief if isinstance(brief, Target) else Target.of(brief)
    request = request or (brief.request() if isinstance(brief, Brief) else
                          f"Build the scene. Use the ids: {', '.join(target.objects)}.")
    spend = Spend(config.token_budget)
    messages = first_messages(request)
    first = await call(model, messages, scene_format(target.objects), config.scene_max_tokens, config, spend, 0,
                       "write")
    rounds = [first]
    try:
        doc = json.loads(first.text)
    except ValueError as exc:
        first.error = f"the scene is not JSON: {exc}"
        first.score = target.score(first.text)
        return RefineResult(target.name, None, "no_scene", rounds, spend, messages)
    first.score, first.applied = target.score(doc), True
    if not isinstance(doc, dict):
        return RefineResult(target.name, None, "no_scene", rounds, spend, messages)
    first.preview_png = _preview(render, doc)
    doc, _, stop = await revise(model, messages, doc, first.score, target, config, spend, rounds, render)
    return RefineResult(target.name, doc, stop, rounds, spend, messages)


__all__ = ["PATCH_RULES", "REFINE_SYSTEM_PROMPT", "RefineConfig", "RefineResult", "Round", "Spend", "Target",
           "apply_answer", "call_candidates", "refine", "revise"]

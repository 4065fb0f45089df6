"""The design dialogue on stored state: what the API's scene threads (api/routes/scene_threads.py) call.

Each call takes and gives a thread as `DesignThread.to_state()` JSON, so a thread lives in the database
between turns, not in a process. The API and the scenarios are sibling layers that never import each other:
the route declares what it needs (its `SceneDialogue` protocol) and the server's composition root (cli.py)
hands it a `SceneThreads`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Sequence

from mainspring.models.base import ChatModel
from mainspring.scenarios.scene3d.dialogue import DesignThread, parse_constraints, start_thread, user_turn
from mainspring.scenarios.scene3d.evaluate import constraint_refs
from mainspring.scenarios.scene3d.refine import RefineConfig


class SceneThreads:
    """Open a thread, take a turn, show a thread: all on JSON state."""

    def constraints(self, values: Sequence[Any], object_ids: Sequence[str]) -> tuple[list[Any], list[tuple[int, str]]]:
        """The constraint models of `values`, and (index, why) for each value that is not one or that names
        an object outside `object_ids` (it could never be checked, so it would fail forever)."""
        known, ok, bad = set(object_ids), [], []
        for i, value in enumerate(values):
            parsed, why = parse_constraints([value])
            if why:
                bad.append((i, why[0]))
                continue
            unknown = [oid for oid in constraint_refs(parsed[0]) if oid not in known]
            if unknown:
                bad.append((i, f"names {', '.join(unknown)}, not an object of the scene ({', '.join(object_ids)})"))
                continue
            ok.append(parsed[0])
        return ok, bad

    async def start(self, model: ChatModel, request: str, object_ids: Sequence[str], constraints: Sequence[Any],
                    max_rounds: int | None = None, token_budget: int | None = None) -> dict[str, Any]:
        """A new thread's state: the first scene for `request`, `constraints` pinned as turn 0's agreement."""
        config = RefineConfig(token_budget=token_budget)
        if max_rounds is not None:
            config = replace(config, max_rounds=max_rounds)
        thread = await start_thread(model, request, list(object_ids), constraints, config)
        return thread.to_state()

    async def turn(self, model: ChatModel, state: dict[str, Any], text: str,
                   constraints: Sequence[Any] = ()) -> tuple[dict[str, Any], dict[str, Any]]:
        """One user turn on the thread in `state`: its new state and the turn's report."""
        thread = DesignThread.from_state(state)
        result = await user_turn(model, thread, text, constraints)
        return thread.to_state(), result.to_dict()

    def object_ids(self, state: dict[str, Any]) -> list[str]:
        """The ids of the thread's current scene: what a turn's constraints may name."""
        return DesignThread.from_state(state).object_ids()

    def view(self, state: dict[str, Any]) -> dict[str, Any]:
        """What a client sees of a thread: the scene, the agreements (label, the turn that agreed it, the
        constraint), every turn's report and the tokens spent."""
        thread = DesignThread.from_state(state)
        spend = thread.spend
        return {"scene": thread.doc,
                "pinned": [{"label": p.label, "turn": p.turn, "constraint": p.constraint.model_dump(mode="json")}
                           for p in thread.pinned],
                "turns": [t.to_dict() for t in thread.turns],
                "max_rounds": thread.config.max_rounds, "token_budget": spend.budget,
                "usage": {"prompt_tokens": spend.prompt_tokens, "cached_tokens": spend.cached_tokens,
                          "completion_tokens": spend.completion_tokens, "total_tokens": spend.total}}


__all__ = ["SceneThreads"]

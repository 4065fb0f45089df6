"""The HTTP routes: every /v1 router, assembled behind authentication.

What the generation routes share lives beside them: api/engine_params.py (request -> SamplingParams),
api/generation.py (one call's engine work) and api/route_call.py (a route called in-process).
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request

from mainspring.api import hooks
from mainspring.store.ids import new_id  # noqa: F401  (the routes' ids: imported from here)


async def _authenticate(request: Request) -> None:
    request.state.principal = await hooks.authenticate(request)


def api_router() -> APIRouter:
    """Every /v1 route, each behind `hooks.authenticate` but the webhook deliveries (`/v1/hooks/{id}`)."""
    # imported here: they import this module
    from mainspring.api.routes import chat, completions, embeddings, messages, models, usage
    from mainspring.api.routes import agents, batches, files, fine_tuning, graders, plans, responses, runs
    from mainspring.api.routes import budgets, diagnostics, scene_threads, scenes, schedules

    router = APIRouter(dependencies=[Depends(_authenticate)])
    for module in (models, chat, completions, messages, embeddings, usage, files, batches, fine_tuning, graders,
                   agents, runs, plans, schedules, diagnostics, responses, scenes, scene_threads, budgets):
        router.include_router(module.router)
    outer = APIRouter()
    outer.include_router(router)
    # webhook deliveries carry no API key: their HMAC signature authenticates them (routes/schedules.py)
    outer.include_router(schedules.hooks_router)
    return outer

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
    """Every /v1 route, each behind `hooks.authenticate`."""
    # imported here: they import this module
    from mainspring.api.routes import chat, completions, embeddings, messages, models, usage
    from mainspring.api.routes import agents, batches, files, fine_tuning, graders, plans, responses, runs

    router = APIRouter(dependencies=[Depends(_authenticate)])
    for module in (models, chat, completions, messages, embeddings, usage, files, batches, fine_tuning, graders,
                   agents, runs, plans, responses):
        router.include_router(module.router)
    return router

"""The caller's project data policy (mainspring/store/data_policy.py) at the API's refusal points.

* local-only: a project whose data may not leave this server gets 403 `permission_error` (code
  `local_only_project`) for an upstream model. 403 rather than 400: the request is well-formed and would be served
  for another project; this project is not permitted to send it there, and no retry or edit of the body changes
  that (the openai SDK raises PermissionDeniedError and does not retry). Checked in upstream.proxy() (chat and
  completions, the only routes that relay to an upstream, batch lines included: they call those routes), at agent
  run and plan creation and run resume (routes/agent_policy.py), and again by the agent runtime whenever a run
  resolves its model (agent_models.AppModels). GET /v1/models leaves upstream models out for such a project.
* never-for-training: fine-tuning job creation, and resuming a paused job, are refused with 403 (code
  `training_not_allowed`); the runner (train/jobs.py) fails such a job when it would start it.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import Request

from mainspring.api.errors import APIError
from mainspring.store.data_policy import DataPolicy, get_policy
from mainspring.store.db import session

LOCAL_ONLY = "local_only_project"
NO_TRAINING = "training_not_allowed"


def project_of_request(request: Request) -> int | None:
    key = getattr(request.state, "principal", None)
    return key.project_id if key is not None else None


def read_policy(db: Any, project_id: int | None) -> DataPolicy:
    """Blocking: one primary-key read (none at all for an anonymous caller)."""
    if project_id is None:
        return DataPolicy()
    with session(db, readonly=True) as s:
        return get_policy(s, project_id)


async def policy_of(request: Request) -> DataPolicy:
    return await asyncio.to_thread(read_policy, request.app.state.economics.db, project_of_request(request))


def local_only_error(model: str, param: str | None = "model") -> APIError:
    return APIError(403, f"the model {model!r} is served by an upstream provider, and this project is local-only: "
                    "its data may not leave this server; use a model served here (GET /v1/models, owned_by "
                    "mainspring), or change the project with `mainspring projects set <project> --no-local-only`",
                    param=param, code=LOCAL_ONLY)


async def refuse_if_local_only(request: Request, model: str, param: str | None = "model") -> None:
    """Raise 403 when the caller's project is local-only (the caller has checked that `model` is an upstream's)."""
    if (await policy_of(request)).local_only:
        raise local_only_error(model, param)


def training_refusal() -> APIError:
    return APIError(403, "this project's data is never used for training (its data policy): fine-tuning jobs "
                    "are refused (created or resumed); change it with `mainspring projects set <project> --training`",
                    code=NO_TRAINING)

"""OpenAI's grader endpoints (/v1/fine_tuning/alpha/graders/validate and /run): check a grader, or grade
one model sample against one item, before spending a fine-tuning job on it. The grader is the one a job
would use (mainspring/train/graders.py); a python grader runs in the sandbox.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel

from mainspring.api.errors import bad_request
from mainspring.train.graders import GradeFailed, Grader, GraderError, evaluate, parse_grader

router = APIRouter()

ERROR_FLAGS = ("formula_parse_error", "invalid_variable_error", "model_grader_parse_error",
               "model_grader_refusal_error", "model_grader_server_error", "other_error", "python_grader_runtime_error",
               "python_grader_server_error", "sample_parse_error", "truncated_observation_error",
               "unresponsive_reward_error")


class GraderCheck(BaseModel):
    grader: dict[str, Any]


class GraderRun(GraderCheck):
    model_sample: str
    item: dict[str, Any] | None = None


def _grader(raw: dict[str, Any]) -> Grader:
    try:
        return parse_grader(raw)
    except GraderError as exc:
        raise bad_request(str(exc), param="grader", code="invalid_grader") from None


def _error_kind(error: str) -> str:
    """Which of OpenAI's error flags a failed grade raises."""
    if "python grader" in error:
        return "python_grader_runtime_error"
    if "has no such field" in error:
        return "invalid_variable_error"
    if "calculate_output" in error:
        return "formula_parse_error"
    return "other_error"


@router.post("/v1/fine_tuning/alpha/graders/validate")
async def validate_grader(body: GraderCheck) -> dict:
    return {"grader": _grader(body.grader).model_dump(exclude_none=True)}


@router.post("/v1/fine_tuning/alpha/graders/run")
async def run_grader(body: GraderRun) -> dict:
    grader = _grader(body.grader)
    t0 = time.perf_counter()
    error = None
    try:
        g = await asyncio.to_thread(evaluate, grader, body.model_sample, body.item or {})
        reward, subs = g.score, g.parts
    except GradeFailed as exc:
        reward, subs, error = 0.0, {}, str(exc)
    errors: dict[str, Any] = {k: False for k in ERROR_FLAGS}
    if error:
        errors[_error_kind(error)] = True
    errors.update(model_grader_server_error_details=None, python_grader_server_error_type=None,
                  python_grader_runtime_error_details=error if errors["python_grader_runtime_error"] else None)
    return {"reward": reward, "sub_rewards": subs, "model_grader_token_usage_per_model": {},
            "metadata": {"name": grader.name, "type": grader.type, "errors": errors, "scores": subs,
                         "execution_time": time.perf_counter() - t0, "token_usage": None,
                         "sampled_model_name": None}}

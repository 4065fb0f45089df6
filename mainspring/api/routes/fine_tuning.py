"""The fine-tuning jobs API (OpenAI's /v1/fine_tuning/jobs), reinforcement fine-tuning only.

Create checks everything it can at once, so mistakes are 400s naming the field rather than jobs that
fail later: the method and its grader, the hyperparameters, the data files (readable, JSONL lines in
the RFT format) and the base model. The job then waits `queued` for the FineTuningRunner
(mainspring/train/jobs.py), which these routes only wake. A job belongs to its creator's project: any
key of the project sees it, another project's key gets a 404 as if it did not exist. Cancel, pause and
resume are in fine_tuning_control.py, the objects and the ownership checks in fine_tuning_objects.py.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
from typing import Any, Literal

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from sqlalchemy import select

from mainspring.api.errors import APIError, bad_request
from mainspring.api.project_policy import policy_of, training_refusal
from mainspring.api.routes import fine_tuning_control
from mainspring.api.routes.files import content_path, get_owned
from mainspring.api.routes.fine_tuning_objects import (checkpoint_object, db, event_object, get_owned as get_job,
                                                       job_object, job_objects, project_of, visible, wake)
from mainspring.api.routes.models import EMBEDDED_MODEL, FAST_SUFFIX, find_finetuned, served_models
from mainspring.store.db import newest_first_page, session
from mainspring.store.tables import FineTuningCheckpointRow, FineTuningEventRow, FineTuningJobRow
from mainspring.train import job_store
from mainspring.train.config import TrainConfigError
from mainspring.train.graders import GraderError, parse_grader
from mainspring.train.rft_config import RFTHyperparameters, resolve, train_config
from mainspring.train.rft_data import DataFileError, held_out_split, read_samples
from mainspring.store.ids import new_id

router = APIRouter()
router.include_router(fine_tuning_control.router)  # cancel, pause, resume

SUFFIX = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # ":" would break the ft:<base>:<suffix>:<id> name


class Method(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["supervised", "dpo", "reinforcement"]
    reinforcement: dict[str, Any] | None = None
    supervised: dict[str, Any] | None = None
    dpo: dict[str, Any] | None = None


class CreateJob(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str
    training_file: str
    validation_file: str | None = None
    suffix: str | None = None
    seed: int | None = Field(None, ge=0, le=2**31 - 1)
    method: Method | None = None
    hyperparameters: dict[str, Any] | None = None  # OpenAI's deprecated top-level field (supervised only)
    integrations: list[Any] | None = None
    metadata: dict[str, str] | None = Field(None, max_length=16)


# ---- create ----------------------------------------------------------------------------------------------
def _method(body: CreateJob) -> tuple[Any, RFTHyperparameters]:
    """The grader and hyperparameters of a reinforcement method; 400s for everything else."""
    if body.method is None:
        raise bad_request("not supported: only reinforcement fine-tuning; pass method={\"type\": \"reinforcement\", "
                          "\"reinforcement\": {\"grader\": ..., \"hyperparameters\": {...}}}", param="method")
    if body.method.type != "reinforcement":
        raise bad_request(f"method.type {body.method.type!r} is not supported: only reinforcement fine-tuning",
                          param="method.type", code="unsupported_method")
    if body.hyperparameters:
        raise bad_request("hyperparameters belong in method.reinforcement.hyperparameters", param="hyperparameters")
    if body.integrations:
        raise bad_request("integrations are not supported by this server", param="integrations")
    rl = body.method.reinforcement
    if not isinstance(rl, dict) or "grader" not in rl:
        raise APIError(400, "missing required parameter: 'method.reinforcement.grader'",
                       param="method.reinforcement.grader", code="missing_required_parameter")
    extra = set(rl) - {"grader", "hyperparameters"}
    if extra:
        raise bad_request(f"unknown field(s) in method.reinforcement: {', '.join(sorted(extra))}",
                          param="method.reinforcement")
    try:
        grader = parse_grader(rl["grader"], "method.reinforcement.grader")
    except GraderError as exc:
        raise bad_request(str(exc), param="method.reinforcement.grader", code="invalid_grader") from None
    try:
        hp = RFTHyperparameters.model_validate(rl.get("hyperparameters") or {})
    except ValidationError as exc:
        e = exc.errors()[0]
        field = ".".join(str(p) for p in e["loc"] if not str(p).startswith(("literal[", "int", "float")))
        param = "method.reinforcement.hyperparameters" + (f".{field}" if field else "")
        raise bad_request(f"{param}: {str(e['msg']).removeprefix('Value error, ')}", param=param) from None
    return grader, hp


async def _base(request: Request, name: str) -> tuple[str, str]:
    """(base model name for the job, model spec the trainer loads) of the `model` a job asks for."""
    served = served_models(request)
    base = served[0].engine.engine.name
    if name in (base, EMBEDDED_MODEL if base.startswith("SmolLM2") else base):
        return base, request.app.state.settings.model
    ft = await find_finetuned(request, name)
    if ft is not None and ft.checkpoint is not None:
        raise bad_request(f"model {name!r} is a checkpoint, which serves but cannot be fine-tuned; fine-tune "
                          f"{base} or a job's final ft: model", param="model", code="model_not_available")
    if ft is not None:  # training on from a fine-tuned model: the new one is named after the original base
        return ft.base or base, str(ft.path)
    hint = f"; {name} is an int4 serving variant" if name.endswith(FAST_SUFFIX) else ""
    raise bad_request(f"model {name!r} cannot be fine-tuned here{hint}; use {base} or one of your ft: models",
                      param="model", code="model_not_available")


def _samples(request: Request, principal: Any, body: CreateJob) -> tuple[int, int]:
    """(training lines, held-out lines) after checking both files; a worker thread."""
    settings = request.app.state.settings
    counts = []
    for param, file_id in (("training_file", body.training_file), ("validation_file", body.validation_file)):
        if file_id is None:
            continue
        with session(db(request), readonly=True) as s:
            try:
                f = get_owned(s, file_id, principal)
            except APIError:
                raise bad_request(f"invalid {param}: no such file {file_id}", param=param,
                                  code="invalid_file") from None
        if f.purpose != "fine-tune":
            raise bad_request(f"invalid {param}: {file_id} has purpose {f.purpose!r}, upload it with purpose "
                              "\"fine-tune\"", param=param, code="invalid_file_purpose")
        try:
            counts.append(read_samples(content_path(settings, f), param, job_store.DOMAIN, param))
        except DataFileError as exc:
            raise bad_request(str(exc), param=exc.param, code="invalid_file_format") from None
    if len(counts) == 2:
        return len(counts[0]), len(counts[1])
    try:
        train, held = held_out_split(counts[0])
    except DataFileError as exc:
        raise bad_request(str(exc), param=exc.param, code="invalid_file_format") from None
    return len(train), len(held)


@router.post("/v1/fine_tuning/jobs")
async def create_job(body: CreateJob, request: Request) -> dict:
    if not (await policy_of(request)).training_allowed:  # first: a no-training project's files are not even read
        raise training_refusal()
    grader, hp = _method(body)
    if body.suffix is not None and not SUFFIX.match(body.suffix):
        raise bad_request("suffix is 1-64 characters of letters, digits, - and _", param="suffix")
    principal = request.state.principal
    base, spec = await _base(request, body.model)
    n_train, n_eval = await asyncio.to_thread(_samples, request, principal, body)
    seed = body.seed if body.seed is not None else random.randrange(2**31)
    resolved = resolve(hp, n_train, n_eval)
    try:
        config = train_config(resolved, model=spec, domain=job_store.DOMAIN, suffix=body.suffix, seed=seed)
    except TrainConfigError as exc:
        raise bad_request(str(exc), param="method.reinforcement.hyperparameters") from None
    method = {"type": "reinforcement", "reinforcement": {"grader": grader.model_dump(exclude_none=True),
                                                         "hyperparameters": resolved}}
    row = FineTuningJobRow(
        id=new_id("ftjob-"), project_id=project_of(principal),
        api_key_id=principal.id if principal is not None else None, model=base, training_file=body.training_file,
        validation_file=body.validation_file, suffix=body.suffix, seed=seed, status="queued",
        method_json=json.dumps(method), config_json=config.model_dump_json(), attempts=0,
        metadata_json=json.dumps(body.metadata) if body.metadata else None, created_at=job_store.now())

    def insert() -> None:
        with session(db(request)) as s:
            s.add(row)
            s.flush()
            job_store.add_event(s, row.id, f"Created fine-tuning job: {row.id}")
            job_store.add_event(s, row.id, f"Validated training file ({n_train} lines for training, {n_eval} "
                                "held out for evaluation); the job is queued")

    await asyncio.to_thread(insert)
    wake(request)
    return job_object(row, [])  # no result file before the first step


# ---- read ------------------------------------------------------------------------------------------------
@router.get("/v1/fine_tuning/jobs")
async def list_jobs(request: Request, after: str | None = None, limit: int = Query(20, ge=1, le=100)) -> dict:
    principal = request.state.principal

    def query() -> tuple[list[dict[str, Any]], bool]:
        with session(db(request), readonly=True) as s:
            rows, more = newest_first_page(s, FineTuningJobRow, visible(principal),
                                           get_job(s, after, principal) if after else None, limit)
            return job_objects(s, rows), more

    data, more = await asyncio.to_thread(query)
    return {"object": "list", "data": data, "has_more": more}


@router.get("/v1/fine_tuning/jobs/{job_id}")
async def retrieve_job(job_id: str, request: Request) -> dict:
    def get() -> dict[str, Any]:
        with session(db(request), readonly=True) as s:
            return job_objects(s, [get_job(s, job_id, request.state.principal)])[0]

    return await asyncio.to_thread(get)


def _event_cursor(after: str | None) -> int | None:
    if after is None:
        return None
    m = re.fullmatch(r"ftevent-(\d+)", after)
    if m is None:
        raise bad_request(f"after {after!r} is not an event id (ftevent-...)", param="after")
    return int(m.group(1))


@router.get("/v1/fine_tuning/jobs/{job_id}/events")
async def list_events(job_id: str, request: Request, after: str | None = None,
                      limit: int = Query(20, ge=1, le=1000)) -> dict:
    cursor = _event_cursor(after)

    def query() -> tuple[list[FineTuningEventRow], bool]:
        with session(db(request), readonly=True) as s:
            get_job(s, job_id, request.state.principal)
            q = select(FineTuningEventRow).where(FineTuningEventRow.job_id == job_id)
            if cursor is not None:
                q = q.where(FineTuningEventRow.id < cursor)
            rows = list(s.scalars(q.order_by(FineTuningEventRow.id.desc()).limit(limit + 1)))
        return rows[:limit], len(rows) > limit

    rows, more = await asyncio.to_thread(query)
    return {"object": "list", "data": [event_object(r) for r in rows], "has_more": more}


@router.get("/v1/fine_tuning/jobs/{job_id}/checkpoints")
async def list_checkpoints(job_id: str, request: Request, after: str | None = None,
                           limit: int = Query(10, ge=1, le=100)) -> dict:
    def query() -> tuple[FineTuningJobRow, list[FineTuningCheckpointRow], bool]:
        with session(db(request), readonly=True) as s:
            job = get_job(s, job_id, request.state.principal)
            q = select(FineTuningCheckpointRow).where(FineTuningCheckpointRow.job_id == job_id)
            if after:
                c = s.get(FineTuningCheckpointRow, after)
                if c is None or c.job_id != job_id:
                    raise bad_request(f"after {after!r} is not a checkpoint of {job_id}", param="after")
                q = q.where(FineTuningCheckpointRow.step_number < c.step_number)
            rows = list(s.scalars(q.order_by(FineTuningCheckpointRow.step_number.desc()).limit(limit + 1)))
        return job, rows[:limit], len(rows) > limit

    job, rows, more = await asyncio.to_thread(query)
    data = [checkpoint_object(r, job) for r in rows]
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": more}

"""A fine-tuning job's checkpoints as models: `ft:<base>:<suffix>:<job id>:ckpt-step-N`, the names the checkpoints
route lists, answer chat and completions for the job's project while the checkpoint's weights are on disk
(the trainer keeps the newest `keep_checkpoints` of a run and deletes older ones).

Nothing is exported: the engine loads the job's base model (the one it trained from) and applies the
checkpoint's trainable weights in memory, a LoRA adapter merged (W + B A alpha / r, as export.apply_adapter
does for an exported adapter) or full weights replacing the base's. Whether the job is still running, paused
or done does not matter. A checkpoint is its job's project's alone: never public like an operator's folder.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.engine import Engine

from mainspring.store.db import session
from mainspring.store.tables import FineTuningCheckpointRow, FineTuningJobRow
from mainspring.train import job_store

NAME = re.compile(r"^(?P<model>ft:.+:(?P<job>ftjob-[0-9A-Za-z]+)):ckpt-step-(?P<step>\d{1,9})$")
WEIGHTS, META = "weights.safetensors", "meta.json"  # train/checkpoint.py's layout


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    folder: Path  # the trainer's checkpoint folder (weights.safetensors, meta.json)
    base_spec: str  # what the job trained from: load_model's spec ("smollm2", a folder, a published ft: model)
    base: str  # the base model's name, as the job reports it
    project_id: int | None
    step: int


def find(db: Engine, data_dir: Path, project_id: int | None, name: str) -> Checkpoint | None:
    """The checkpoint `name` of a job of `project_id` whose weights are still on disk; else None."""
    m = NAME.match(name)
    if m is None:
        return None
    with session(db, readonly=True) as s:
        job = s.get(FineTuningJobRow, m["job"])
        if job is None or job.project_id != project_id:
            return None
        if job_store.model_name(job.model, job.suffix, job.id) != m["model"]:  # the job's own name, exactly
            return None
        row = s.scalar(select(FineTuningCheckpointRow).where(FineTuningCheckpointRow.job_id == job.id,
                                                             FineTuningCheckpointRow.step_number == int(m["step"])))
    if row is None:
        return None
    folder = data_dir / row.path
    if not (folder / WEIGHTS).is_file() or not (folder / META).is_file():
        return None
    spec = json.loads(job.config_json).get("model")
    if not isinstance(spec, str):
        return None
    return Checkpoint(folder, spec, job.model, job.project_id, row.step_number)


def apply(loaded: Any, folder: Path) -> Any:
    """`loaded` (the base's LoadedModel) with the checkpoint's weights: LoRA merged, or full weights."""
    from safetensors.torch import load_file

    from mainspring.train.export import hf_state_dict
    from mainspring.train.policy import ADAPTER

    meta = json.loads((folder / META).read_text())
    lora = (meta.get("config") or {}).get("lora")
    tensors = load_file(str(folder / WEIGHTS))
    sd = dict(loaded.state_dict)
    if lora:
        scale = float(lora["alpha"]) / int(lora["r"])  # peft's scaling (no rsLoRA in our LoraSpec)
        deltas = {}
        for key, a in tensors.items():
            if f".lora_A.{ADAPTER}.weight" in key:
                module = key.split(".lora_A.")[0]
                b = tensors[f"{module}.lora_B.{ADAPTER}.weight"]
                deltas[module + ".weight"] = (b.float() @ a.float()) * scale
        new = {n: sd[n].float() + d for n, d in _checked(sd, hf_state_dict(loaded.config, deltas)).items()}
    else:
        new = dict(_checked(sd, hf_state_dict(loaded.config, tensors)))
    for n, t in new.items():
        sd[n] = t.to(sd[n].dtype).contiguous()
    return dataclasses.replace(loaded, state_dict=sd)


def _checked(sd: dict[str, Any], tensors: dict[str, Any]) -> dict[str, Any]:
    for name, t in tensors.items():
        if name not in sd:
            raise ValueError(f"checkpoint tensor {name} has no counterpart in the base model")
        if tuple(sd[name].shape) != tuple(t.shape):
            raise ValueError(f"checkpoint tensor {name}: shape {tuple(t.shape)} != base {tuple(sd[name].shape)}")
    return tensors

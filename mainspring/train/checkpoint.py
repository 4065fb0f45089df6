"""Checkpoints of a run: the trainable weights (adapter or full), optimizer and LR schedule, the
domain sampler, every RNG, and the config that made them, so `--resume` continues the exact run:
its next step has the loss the uninterrupted run's would have had.

Layout: <run>/checkpoints/step-000005/{weights.safetensors, state.pt, meta.json}; a checkpoint is
written to a temporary folder and renamed, so a crash mid-write leaves the previous one whole.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from mainspring.train.config import TrainConfig

# fields that must match for a checkpoint to continue a run (steps, eval and logging may change)
IDENTITY_FIELDS = ("model", "lora", "interference", "group_size", "seed")


class CheckpointError(ValueError):
    """A checkpoint that is missing, damaged or from a different run."""


def checkpoint_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def list_checkpoints(run_dir: Path) -> list[Path]:
    root = checkpoint_dir(run_dir)
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir()
                  if p.is_dir() and p.name.startswith("step-") and (p / "meta.json").is_file())


def rng_state() -> dict:
    return {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    np.random.set_state(tuple(state["numpy"]))


def save_checkpoint(run_dir: Path, step: int, config: TrainConfig, weights: dict[str, torch.Tensor],
                    state: dict, keep: int) -> Path:
    root = checkpoint_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:06d}"
    tmp = root / f".tmp-{final.name}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    save_file({k: v.contiguous() for k, v in weights.items()}, str(tmp / "weights.safetensors"))
    torch.save({**state, "rng": rng_state()}, tmp / "state.pt")
    meta = {"step": step, "config": config.model_dump(mode="json"), "domains": [d.name for d in config.domains]}
    (tmp / "meta.json").write_text(json.dumps(meta, indent=2))
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    for old in list_checkpoints(run_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_checkpoint(path: Path, config: TrainConfig) -> tuple[int, dict[str, torch.Tensor], dict]:
    """(step, trainable weights, state) of a checkpoint made by a run of the same identity."""
    path = Path(path)
    try:
        meta = json.loads((path / "meta.json").read_text())
        weights = load_file(str(path / "weights.safetensors"))
        state = torch.load(path / "state.pt", weights_only=False)
    except (OSError, ValueError, RuntimeError) as exc:
        raise CheckpointError(f"checkpoint {path} cannot be read: {exc}") from None
    saved = meta.get("config", {})
    now = config.model_dump(mode="json")
    diff = [f for f in IDENTITY_FIELDS if saved.get(f) != now.get(f)]
    if sorted(meta.get("domains", [])) != sorted(d.name for d in config.domains):
        diff.append("domains")
    if diff:
        detail = "; ".join(f"{f}: checkpoint {saved.get(f, meta.get('domains'))!r} vs config {now.get(f)!r}"
                           for f in diff)
        raise CheckpointError(f"checkpoint {path} is from a different run ({detail})")
    return int(meta["step"]), weights, state

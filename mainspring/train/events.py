"""What a training run reports while it runs and when it ends (the CLI's bars, the fine-tuning
jobs API's events and checkpoints, and the report all read these)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal

EventKind = Literal["started", "step", "eval", "checkpoint", "gate", "export", "message", "alarm", "finished"]


@dataclass
class TrainEvent:
    kind: EventKind
    step: int
    data: dict[str, Any] = field(default_factory=dict)
    # step: loss, reward (mean), reward_<domain>, kl, tokens_per_s, step_s, rollout_s, sync_s, scorer_errors
    # eval: phase ("before"|"periodic"|"after"), per-domain mean, n, ci (after: delta + paired bootstrap CI)
    # checkpoint: path; export: path, model id; gate: passed, regressions
    # alarm: a Finding's JSON (inspect/monitor.py: reward divergence, length drift, entropy collapse, ...)


OnEvent = Callable[[TrainEvent], None]
ShouldStop = Callable[[], bool]


@dataclass
class TrainResult:
    run_dir: Path
    steps_done: int
    stopped: bool  # should_stop() ended it early (a checkpoint was written first)
    eval_before: dict[str, Any] | None = None
    eval_after: dict[str, Any] | None = None
    gate_passed: bool | None = None
    export_dir: Path | None = None  # an HF folder `load_model` reads; None if the gate refused
    checkpoints: list[Path] = field(default_factory=list)

"""What a job's TrainEvents become: rows of fine_tuning_events (and checkpoints), as OpenAI clients read them.

Step events are `metrics` events whose data carries OpenAI's `step` and `total_steps` beside our own
figures (reward, reward per domain, loss, kl, tokens_per_s, ...); everything else is a `message` event.
Called on the trainer's thread, between steps: a few small writes per step.
"""

from __future__ import annotations

import math
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy.engine import Engine

from mainspring.train import job_store
from mainspring.train.events import TrainEvent


def _numbers(data: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in data.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}


def step_tokens(data: dict[str, Any]) -> int:
    """Tokens one step processed, as the trainer reports them (its own count, else rate × time)."""
    for key in ("tokens", "trained_tokens", "step_tokens"):
        if isinstance(data.get(key), (int, float)):
            return int(data[key])
    rate, secs = data.get("tokens_per_s"), data.get("step_s")
    if isinstance(rate, (int, float)) and isinstance(secs, (int, float)) and math.isfinite(rate * secs):
        return int(rate * secs)
    return 0


class JobEvents:
    """The on_event callback of one job's run."""

    def __init__(self, db: Engine, job_id: str, total_steps: int, data_dir: Path) -> None:
        self.db, self.job_id, self.total_steps, self.data_dir = db, job_id, total_steps, data_dir
        self.last_metrics: dict[str, float] = {}
        self.exported: Path | None = None

    def __call__(self, ev: TrainEvent) -> None:
        handler = getattr(self, f"_{ev.kind}", None)
        if handler is not None:
            handler(ev)
        else:
            job_store.event(self.db, self.job_id, str(ev.data.get("message") or ev.kind), data=_public(ev.data))

    def _step(self, ev: TrainEvent) -> None:
        nums = _numbers(ev.data)
        self.last_metrics = {"step": float(ev.step), **nums}
        reward = nums.get("reward")
        text = f"Step {ev.step}/{self.total_steps}"
        if reward is not None:
            text += f": reward {reward:.3f}"
        if "loss" in nums:
            text += f", loss {nums['loss']:.4f}"
        job_store.event(self.db, self.job_id, text, type="metrics",
                        data={"step": ev.step, "total_steps": self.total_steps, **nums})
        eta = None
        if "step_s" in nums and self.total_steps > ev.step:
            eta = job_store.now() + timedelta(seconds=nums["step_s"] * (self.total_steps - ev.step))
        job_store.add_progress(self.db, self.job_id, step_tokens(ev.data), eta)
        failed = int(nums.get("scorer_errors", 0))
        if failed:  # a grader that fails (python error, missing field) is a reward of 0: say so, loudly
            examples = [str(e)[:300] for e in (ev.data.get("scorer_error_examples") or [])[:3]]
            job_store.event(self.db, self.job_id, f"{failed} completions could not be graded at step {ev.step} "
                            f"(scored 0): {'; '.join(examples) or 'no details'}", level="warn")

    def _eval(self, ev: TrainEvent) -> None:
        phase = ev.data.get("phase", "")
        # per domain: {"mean", "ci", "n", "mean_length", "scores": {sample id: score}}; the per-sample
        # scores stay in the run folder (eval_*.json), the event keeps the summary
        domains = {k: {f: v[f] for f in ("mean", "ci", "n", "mean_length") if f in v}
                   for k, v in ev.data.items() if isinstance(v, dict) and "mean" in v}
        summary = ", ".join(f"{k} {v['mean']:.3f} (n={v.get('n', '?')})" for k, v in domains.items())
        job_store.event(self.db, self.job_id, f"Evaluation {phase}".strip() + (f": {summary}" if summary else ""),
                        type="metrics", data={"step": ev.step, "phase": phase, **domains})

    def _checkpoint(self, ev: TrainEvent) -> None:
        path = Path(str(ev.data.get("path", "")))
        try:
            shown = str(path.resolve().relative_to(self.data_dir.resolve()))
        except ValueError:
            shown = str(path)
        metrics = {"step": float(ev.step)}
        if "loss" in self.last_metrics:
            metrics["train_loss"] = self.last_metrics["loss"]
        if "reward" in self.last_metrics:
            metrics["train_reward"] = self.last_metrics["reward"]
        job_store.save_checkpoint(self.db, self.job_id, ev.step, shown, metrics)

    def _gate(self, ev: TrainEvent) -> None:
        passed = ev.data.get("passed")
        regressions = ev.data.get("regressions") or []
        text = "Evaluation gate passed" if passed else f"Evaluation gate refused the export: regressions {regressions}"
        job_store.event(self.db, self.job_id, text, level="info" if passed else "warn", data=ev.data)

    def _export(self, ev: TrainEvent) -> None:
        if ev.data.get("path"):
            self.exported = Path(str(ev.data["path"]))
        job_store.event(self.db, self.job_id, "Exported the trained weights", data={"step": ev.step})

    def _started(self, ev: TrainEvent) -> None:
        job_store.event(self.db, self.job_id, f"Training started at step {ev.step}", data=_public(ev.data))

    def _finished(self, ev: TrainEvent) -> None:
        job_store.event(self.db, self.job_id, f"Training finished after step {ev.step}", data=_public(ev.data))


def _public(data: dict[str, Any]) -> dict[str, Any]:
    """Event data without the server's paths (run folder, export folder): callers see the API, not the disk."""
    return {k: v for k, v in data.items() if k not in ("run_dir", "export_dir", "path")}

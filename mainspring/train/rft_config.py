"""A reinforcement fine-tuning job's hyperparameters (OpenAI's names) and the TrainConfig they become.

OpenAI's knobs map onto our GRPO run as follows ("auto" takes the value in brackets):

- batch_size [min(4, training lines)]      -> prompts_per_step
- n_epochs [1]                             -> steps = ceil(n_epochs · training lines / batch_size)
- learning_rate_multiplier [1]             -> lr = multiplier × TrainConfig's default lr
- compute_multiplier [1]                   -> group_size = max(2, round(4 × multiplier)): more exploration
- eval_samples [min(50, held-out lines)]   -> eval_size (held-out prompts evaluated before and after)
- eval_interval [TrainConfig's default]    -> checkpoint_every
- reasoning_effort                         -> accepted, no effect (the model does not reason in a hidden channel)

Mainspring's own additions, for small and test runs: `steps` (instead of n_epochs), `group_size`,
`max_tokens` and `temperature` (per completion), and `eval: false` (no evaluation before or after, so no
regression gate either).
"""

from __future__ import annotations

import math
from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, model_validator

from mainspring.train.config import TrainConfig

Auto = Literal["auto"]
DEFAULT_GROUP = 4
AUTO_EVAL_SAMPLES = 50


class RFTHyperparameters(BaseModel):
    model_config = ConfigDict(extra="forbid")

    batch_size: Union[Auto, int] = Field("auto", description="prompts per step")
    n_epochs: Union[Auto, int] = "auto"
    learning_rate_multiplier: Union[Auto, float] = "auto"
    compute_multiplier: Union[Auto, float] = "auto"
    eval_interval: Union[Auto, int] = "auto"
    eval_samples: Union[Auto, int] = "auto"
    reasoning_effort: Literal["default", "low", "medium", "high"] | None = None
    steps: int | None = Field(None, ge=1, le=100_000)
    group_size: int | None = Field(None, ge=2, le=64)
    max_tokens: int | None = Field(None, ge=1, le=4096)
    temperature: float | None = Field(None, ge=0.0, le=10.0)
    eval: bool | None = None

    @model_validator(mode="after")
    def _ranges(self) -> "RFTHyperparameters":
        # "auto" or a number in range: pydantic's Field bounds cannot apply to one branch of a union
        for name, lo, hi in (("batch_size", 1, 4096), ("n_epochs", 1, 50), ("learning_rate_multiplier", 1e-6, 100),
                             ("compute_multiplier", 1e-3, 16), ("eval_interval", 1, 100_000),
                             ("eval_samples", 1, 100_000)):
            v = getattr(self, name)
            if v != "auto" and not lo <= v <= hi:
                raise ValueError(f"{name} must be \"auto\" or between {lo:g} and {hi:g}, got {v!r}")
        return self


def resolve(hp: RFTHyperparameters, n_train: int, n_eval: int) -> dict[str, Any]:
    """Every knob with "auto" replaced by the value this job uses (what the job object reports)."""
    batch = min(4, n_train) if hp.batch_size == "auto" else hp.batch_size
    epochs = 1 if hp.n_epochs == "auto" else hp.n_epochs
    out: dict[str, Any] = {
        "batch_size": batch,
        "n_epochs": epochs,
        "learning_rate_multiplier": 1.0 if hp.learning_rate_multiplier == "auto" else hp.learning_rate_multiplier,
        "compute_multiplier": 1.0 if hp.compute_multiplier == "auto" else hp.compute_multiplier,
        "eval_interval": TrainConfig.model_fields["checkpoint_every"].default
        if hp.eval_interval == "auto" else hp.eval_interval,
        "eval_samples": min(AUTO_EVAL_SAMPLES, n_eval) if hp.eval_samples == "auto" else hp.eval_samples,
        "reasoning_effort": hp.reasoning_effort or "default",
    }
    out["steps"] = hp.steps or max(1, math.ceil(epochs * n_train / batch))
    out["group_size"] = hp.group_size or max(2, round(DEFAULT_GROUP * out["compute_multiplier"]))
    for extra in ("max_tokens", "temperature", "eval"):
        if getattr(hp, extra) is not None:
            out[extra] = getattr(hp, extra)
    return out


def train_config(resolved: dict[str, Any], *, model: str, domain: str, suffix: str | None, seed: int) -> TrainConfig:
    """The run's TrainConfig; raises TrainConfigError naming the field if the combination cannot run."""
    spec: dict[str, Any] = {"name": domain}
    for knob in ("max_tokens", "temperature"):
        if knob in resolved:
            spec[knob] = resolved[knob]
    evaluate = resolved.get("eval", True)
    raw = {
        "model": model, "domains": [spec], "steps": resolved["steps"], "prompts_per_step": resolved["batch_size"],
        "group_size": resolved["group_size"],
        "lr": TrainConfig.model_fields["lr"].default * resolved["learning_rate_multiplier"],
        "eval_before": evaluate, "eval_after": evaluate, "eval_size": resolved["eval_samples"],
        "checkpoint_every": resolved["eval_interval"], "suffix": suffix or "ft", "seed": seed,
    }
    return TrainConfig.parse(raw, "hyperparameters")

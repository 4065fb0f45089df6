"""The typed configuration of one training run (`mainspring train CONFIG.yaml`)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class TrainConfigError(ValueError):
    """A config that cannot run: the message names the field and the problem."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DomainSpec(_Strict):
    """One domain of the run: a shipped name, or a user domain from a data file and a scorer.
    Unset knobs keep the domain's own settings."""

    name: str
    data: str | None = None  # JSONL of samples (user domain); see domains/registry.py
    scorer: str | None = None  # "package.module:function" or an http(s) URL of a scorer service
    max_tokens: int | None = Field(None, ge=1, le=4096)
    temperature: float | None = Field(None, ge=0.0, le=10.0)
    loss_weight: float | None = Field(None, ge=0.0)
    lr_scale: float | None = Field(None, ge=0.0)
    sampling_weight: float | None = Field(None, ge=0.0)
    train_size: int | None = Field(None, ge=1)  # cap on the train split (shipped domains generate more)
    eval_size: int | None = Field(None, ge=1)


class LoraSpec(_Strict):
    r: int = Field(8, ge=1)
    alpha: float = Field(16.0, gt=0)
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    targets: list[str] = ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]


class TrainConfig(_Strict):
    model: str = "smollm2"
    domains: list[DomainSpec] = Field(min_length=1)
    # one JSONL of prompts for several domains: tagged lines go to their domain, untagged ones through
    # the MiniLM domain router (mixed.py)
    mixed_data: str | None = None
    steps: int = Field(10, ge=1)
    prompts_per_step: int = Field(4, ge=1)
    group_size: int = Field(4, ge=2, description="G: samples per prompt")
    # optimisation
    lr: float = Field(2e-4, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    warmup_steps: int = Field(0, ge=0)
    lr_schedule: Literal["constant", "cosine", "linear"] = "constant"
    max_grad_norm: float = Field(1.0, gt=0)
    lora: LoraSpec | None = Field(default_factory=LoraSpec)  # null = full weights
    micro_batch: int = Field(8, ge=1, description="completions per forward/backward (gradient accumulation)")
    # bf16 autocast of the training forward; "auto" = where the CPU has native bf16 (AVX512-BF16/AMX). Off by
    # default: on a Xeon with AMX the forward ran 1.7x faster but the backward slower, the step no faster
    autocast: Literal["auto", "off", "bf16"] = "off"
    # GRPO
    clip_low: float = Field(0.2, ge=0)
    clip_high: float = Field(0.28, ge=0, description="clip-higher (DAPO): a wider upper bound")
    kl_beta: float = Field(0.0, ge=0, description="k3 KL to the reference model; 0 = no reference")
    updates_per_batch: int = Field(1, ge=1, description="policy updates per rollout batch (mu)")
    scale_rewards: Literal["group", "none"] = "group"
    dynamic_sampling: bool = True
    max_refill_rounds: int = Field(2, ge=0, description="extra rollout rounds to replace zero-variance groups")
    # domains
    sampling: Literal["static", "progress"] = "static"
    # every weighted domain gets a prompt in every step (the rest by weight); None = under pcgrad/cagrad
    # only, whose projection protects only the domains present in the step
    every_domain_per_step: bool | None = None
    interference: Literal["weights", "sum", "pcgrad", "cagrad"] = "weights"  # see update.py
    cagrad_c: float = Field(0.5, ge=0)
    # evaluation and export
    eval_before: bool = True
    eval_after: bool = True
    eval_size: int | None = Field(None, ge=1, description="held-out prompts per domain (None = all)")
    eval_every: int | None = Field(None, ge=1, description="also evaluate the held-out set every N steps: the "
                                   "independent metric of the reward-hacking alarm (None = before and after only)")
    gate_delta: float = Field(0.05, ge=0, description="export refused if a domain drops by more")
    export: bool = True
    suffix: str = "ft"
    checkpoint_every: int = Field(5, ge=1)
    keep_checkpoints: int = Field(2, ge=1)
    seed: int = 0
    threads: int = Field(0, ge=0, description="torch threads; 0 = the Settings default")

    @model_validator(mode="after")
    def _check(self) -> "TrainConfig":
        names = [d.name for d in self.domains]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"domain listed twice: {sorted(dup)}")
        if self.warmup_steps > self.steps:
            raise ValueError("warmup_steps must not exceed steps")
        return self

    @property
    def covers_domains(self) -> bool:
        if self.every_domain_per_step is not None:
            return self.every_domain_per_step
        return self.interference in ("pcgrad", "cagrad")

    @classmethod
    def load(cls, path: str | Path) -> "TrainConfig":
        path = Path(path)
        try:
            raw = yaml.safe_load(path.read_text())
        except OSError as exc:
            raise TrainConfigError(f"cannot read config {path}: {exc.strerror}") from None
        except yaml.YAMLError as exc:
            raise TrainConfigError(f"{path} is not valid YAML: {exc}") from None
        if not isinstance(raw, dict):
            raise TrainConfigError(f"{path}: the config must be a mapping of fields, got {type(raw).__name__}")
        return cls.parse(raw, str(path))

    @classmethod
    def parse(cls, raw: dict, where: str = "config") -> "TrainConfig":
        try:
            return cls.model_validate(raw)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(top)'}: {e['msg']}" for e in exc.errors())
            raise TrainConfigError(f"{where}: {problems}") from None

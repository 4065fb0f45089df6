"""One policy update from scored groups: per-domain backward passes, the domains' gradients combined
by the run's interference mode, the optimizer step(s), all exact under micro-batching and data
parallelism.

Modes (TrainConfig.interference):
- `weights` (default): every domain has its own AdamW state and steps at lr x lr_scale x loss_weight.
  Under Adam a gradient's scale cancels, so a weight on the loss becomes a step size here; the
  domains' updates are summed. A domain whose gradients are small or noisy still moves at its own
  rate instead of being drowned by a louder one (gradient magnitude is what conflicts in practice:
  Elich et al.), and a domain that regresses can be slowed without touching the others.
- `sum`: the naive baseline: one AdamW on the token-level mean over the whole batch, every domain's
  tokens weighted by its loss_weight.
- `pcgrad` / `cagrad`: one gradient per domain (token mean, times loss_weight), combined by gradient
  surgery (interference.py), one AdamW.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import torch

from mainspring.train.config import TrainConfig
from mainspring.train.domains.base import DomainSettings
from mainspring.train.grpo import policy_loss
from mainspring.train.interference import combine
from mainspring.train.policy import Policy


@dataclass
class TrainItem:
    """One completion ready for the loss: the whole sequence and where its completion starts."""

    ids: list[int]
    start: int
    advantage: float
    domain: str
    old_logp: torch.Tensor | None = None  # [completion tokens] when updates_per_batch > 1


class World:
    """Data parallelism over torch.distributed (the tensors are the CPU policy's: gloo); one process = size 1."""

    def __init__(self) -> None:
        import torch.distributed as dist

        self.on = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if self.on else 0
        self.size = dist.get_world_size() if self.on else 1

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        if self.on:
            import torch.distributed as dist

            dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t


def lr_lambda(cfg: TrainConfig):
    def f(step: int) -> float:
        if cfg.warmup_steps and step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        span = max(1, cfg.steps - cfg.warmup_steps)
        frac = min(1.0, (step - cfg.warmup_steps) / span)
        if cfg.lr_schedule == "cosine":
            return 0.5 * (1 + math.cos(math.pi * frac))
        if cfg.lr_schedule == "linear":
            return 1.0 - frac
        return 1.0
    return f


class Updater:
    def __init__(self, policy: Policy, cfg: TrainConfig, settings: dict[str, DomainSettings],
                 world: World | None = None) -> None:
        self.policy, self.cfg, self.settings = policy, cfg, settings
        self.world = world or World()
        self.params = list(policy.trainable().values())
        self.names = list(settings)  # a fixed order every rank agrees on
        self.generator = torch.Generator().manual_seed(cfg.seed)
        if cfg.interference == "weights":
            keys = self.names
            wd = cfg.weight_decay / len(keys)  # decoupled decay applied once in total, not once per domain
            self.optimizers = {n: torch.optim.AdamW(self.params, lr=cfg.lr * self._scale(n), weight_decay=wd)
                               for n in keys}
        else:
            self.optimizers = {"all": torch.optim.AdamW(self.params, lr=cfg.lr, weight_decay=cfg.weight_decay)}
        self.schedulers = {k: torch.optim.lr_scheduler.LambdaLR(o, lr_lambda(cfg)) for k, o in self.optimizers.items()}

    def _scale(self, name: str) -> float:
        s = self.settings[name]
        return s.lr_scale * s.loss_weight

    # -- gradients --------------------------------------------------------------------------------
    def _batches(self, items: list[TrainItem]):
        """Forward units: up to micro_batch completions of one prompt, its tokens computed once."""
        groups: dict[tuple[int, ...], list[TrainItem]] = {}
        for x in items:
            groups.setdefault(tuple(x.ids[:x.start]), []).append(x)
        mb = self.cfg.micro_batch
        for prompt, members in groups.items():
            for i in range(0, len(members), mb):
                chunk = members[i:i + mb]
                lens = torch.tensor([len(x.ids) - x.start for x in chunk])
                comps = torch.zeros(len(chunk), int(lens.max()), dtype=torch.long)
                for r, x in enumerate(chunk):
                    comps[r, :lens[r]] = torch.tensor(x.ids[x.start:])
                yield chunk, torch.tensor(prompt), comps, lens

    def old_logprobs(self, items: list[TrainItem]) -> None:
        """The behaviour policy's log-probs, before the first of several updates on one batch."""
        with torch.no_grad():
            for chunk, prompt, comps, lens in self._batches(items):
                lp = self.policy.group_logprobs(prompt, comps, lens)
                for r, x in enumerate(chunk):
                    x.old_logp = lp[r, :lens[r]].clone()

    def _domain_grad(self, items: list[TrainItem], tokens: int, weight: float, stats: dict) -> list[torch.Tensor]:
        """Gradient of sum(token terms) / tokens over `items` (this rank's share), summed over ranks."""
        for p in self.params:
            p.grad = None
        for chunk, prompt, comps, lens in self._batches(items):
            lp, entropy = self.policy.group_logprobs_and_entropy(prompt, comps, lens)
            old = lp.detach().clone()
            for r, x in enumerate(chunk):
                if x.old_logp is not None:
                    old[r, :lens[r]] = x.old_logp
            ref = None
            if self.cfg.kl_beta > 0:
                with torch.no_grad():
                    ref = self.policy.group_logprobs(prompt, comps, lens, reference=True)
            adv = torch.tensor([x.advantage for x in chunk], dtype=lp.dtype)
            mask = torch.arange(comps.shape[1])[None, :] < lens[:, None]
            parts = policy_loss(lp, old, adv, mask, tokens, self.cfg.clip_low, self.cfg.clip_high, ref,
                                self.cfg.kl_beta)
            (parts.loss * weight).backward()
            stats["loss"] += float(parts.loss.detach()) * weight
            stats["clipped"] += parts.clipped_tokens
            stats["kl_sum"] += parts.kl_sum
            stats["entropy_sum"] += float((entropy * mask).sum())
            stats["tokens"] += parts.tokens
        grads = [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for p in self.params]
        if self.world.size > 1:
            flat = self.world.all_reduce(torch.cat([g.flatten() for g in grads]))
            grads = _unflatten(flat, grads)
        return grads

    def _counts(self, items: list[TrainItem]) -> tuple[dict[str, list[TrainItem]], dict[str, int]]:
        """Items by domain, and every rank's completion tokens per domain (the exact denominators)."""
        counts = torch.zeros(len(self.names), dtype=torch.float64)
        by_domain: dict[str, list[TrainItem]] = {n: [] for n in self.names}
        for x in items:
            by_domain[x.domain].append(x)
            counts[self.names.index(x.domain)] += len(x.ids) - x.start
        counts = self.world.all_reduce(counts)
        return by_domain, {n: int(c) for n, c in zip(self.names, counts.tolist()) if c > 0}

    def gradients(self, items: list[TrainItem], stats: dict | None = None) -> dict[str, list[torch.Tensor]]:
        """The gradient each optimizer applies: {"all": g} (sum, pcgrad, cagrad) or {domain: g} (weights)."""
        cfg = self.cfg
        stats = stats if stats is not None else _new_stats()
        by_domain, counts = self._counts(items)
        if not counts:
            return {}
        if cfg.interference == "sum":
            return {"all": self._summed(by_domain, list(counts), sum(counts.values()), stats)}
        if cfg.interference == "weights":
            return {n: self._domain_grad(by_domain[n], counts[n], 1.0, stats) for n in counts}
        per = [self._domain_grad(by_domain[n], counts[n], self.settings[n].loss_weight, stats) for n in counts]
        if len(per) == 1:
            return {"all": per[0]}
        flat = combine(cfg.interference, [_flatten(g) for g in per], cagrad_c=cfg.cagrad_c, generator=self.generator)
        return {"all": _unflatten(flat, per[0])}

    def step(self, items: list[TrainItem]) -> dict[str, float]:
        """Apply one update (updates_per_batch times over the same items); returns metrics."""
        cfg = self.cfg
        stats = _new_stats()
        if cfg.updates_per_batch > 1:
            self.old_logprobs(items)
        for _ in range(cfg.updates_per_batch):
            for key, grads in self.gradients(items, stats).items():
                self._apply(key, grads, stats)
        with warnings.catch_warnings():  # a domain absent from this step skipped its optimizer: time still moves
            warnings.simplefilter("ignore", UserWarning)
            for s in self.schedulers.values():
                s.step()
        for key in ("loss", "clipped", "kl_sum", "entropy_sum"):  # per update, like tokens
            stats[key] /= cfg.updates_per_batch
        stats["tokens"] //= cfg.updates_per_batch
        return stats

    def _summed(self, by_domain, present, total: int, stats: dict) -> list[torch.Tensor]:
        acc = None
        for n in present:
            g = self._domain_grad(by_domain[n], total, self.settings[n].loss_weight, stats)
            acc = g if acc is None else [a + b for a, b in zip(acc, g)]
        assert acc is not None  # gradients() returns early when no domain is present
        return acc

    def _apply(self, key: str, grads: list[torch.Tensor], stats: dict) -> None:
        for p, g in zip(self.params, grads):
            p.grad = g
        norm = torch.nn.utils.clip_grad_norm_(self.params, self.cfg.max_grad_norm)
        stats["grad_norm"] = max(stats["grad_norm"], float(norm))
        self.optimizers[key].step()
        for p in self.params:
            p.grad = None

    # -- checkpoints ------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"optimizers": {k: o.state_dict() for k, o in self.optimizers.items()},
                "schedulers": {k: s.state_dict() for k, s in self.schedulers.items()},
                "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        if set(state["optimizers"]) != set(self.optimizers):
            raise ValueError(f"checkpoint optimizers {sorted(state['optimizers'])} do not match this run's "
                             f"{sorted(self.optimizers)} (interference mode or domains changed)")
        for k, o in self.optimizers.items():
            o.load_state_dict(state["optimizers"][k])
            self.schedulers[k].load_state_dict(state["schedulers"][k])
        self.generator.set_state(state["generator"])


def _new_stats() -> dict:
    return {"loss": 0.0, "clipped": 0, "kl_sum": 0.0, "entropy_sum": 0.0, "tokens": 0, "grad_norm": 0.0}


def _flatten(grads: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([g.flatten() for g in grads])


def _unflatten(flat: torch.Tensor, like: list[torch.Tensor]) -> list[torch.Tensor]:
    out, i = [], 0
    for g in like:
        out.append(flat[i:i + g.numel()].view_as(g).to(g.dtype))
        i += g.numel()
    return out

"""`run_training`: the GRPO loop across domains, on one process or many (torch.distributed).

One step: draw prompts by domain weight -> G rollouts each on our LLMEngine -> score by domain ->
drop zero-variance groups and refill (dynamic sampling) -> group-relative advantages -> the update
(update.py) -> sync the new weights into the engine -> metrics, events, a checkpoint every k steps.
Around the loop: held-out eval before and after, the no-regression gate, export, the report.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from pathlib import Path

import torch

from mainspring.config import Settings, get_settings
from mainspring.train.checkpoint import (CheckpointError, list_checkpoints, load_checkpoint, save_checkpoint,
                                         set_rng_state)
from mainspring.train.config import TrainConfig
from mainspring.train.domains.base import Domain
from mainspring.train.events import OnEvent, ShouldStop, TrainEvent, TrainResult
from mainspring.train.grpo import group_advantages, has_signal
from mainspring.train.inspect.monitor import TrainingMonitor
from mainspring.train.policy import Policy
from mainspring.train.rollout import Group, RolloutStats, generate_groups
from mainspring.train.sampler import DomainSampler
from mainspring.train.update import TrainItem, Updater, World

log = logging.getLogger(__name__)


def bf16_supported() -> bool:
    """bf16 autocast pays only where the CPU has native bf16 (AVX512-BF16 / AMX) or on a GPU."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def items_from_groups(groups: list[Group], scale: str) -> list[TrainItem]:
    if not groups:
        return []
    adv = group_advantages(torch.stack([g.rewards() for g in groups]), scale)
    items = []
    for g, a in zip(groups, adv):
        for c, ai in zip(g.completions, a.tolist()):
            if c.completion_ids:
                items.append(TrainItem(c.prompt_ids + c.completion_ids, len(c.prompt_ids), ai, g.domain))
    return items


class Trainer:
    def __init__(self, config: TrainConfig, run_dir: Path, *, domains: dict[str, Domain] | None = None,
                 on_event: OnEvent | None = None, settings: Settings | None = None, loaded=None) -> None:
        from mainspring.engine.config import EngineConfig
        from mainspring.engine.engine import LLMEngine
        from mainspring.engine.loader import load_model

        self.cfg, self.run_dir = config, Path(run_dir)
        self.settings = settings or get_settings()
        self.world = World()
        self.on_event = on_event or (lambda e: None)
        torch.set_num_threads(config.threads or self.settings.resolved_threads())
        torch.manual_seed(config.seed)
        if domains is None:
            from mainspring.train.domains.registry import load_domains

            domains = load_domains(config.domains, config.seed)
        missing = [d.name for d in config.domains if d.name not in domains]
        if missing:
            raise ValueError(f"no domain object given for {missing}")
        self.domains = {d.name: domains[d.name] for d in config.domains}
        self.mixed = None
        if config.mixed_data:
            from mainspring.train.mixed import add_mixed

            self.mixed = add_mixed(config.mixed_data, self.domains, config.seed)
        self.loaded = loaded or load_model(config.model, self.settings.cache_dir)
        per_step = config.prompts_per_step * config.group_size
        # the engine adopts its state dict's tensors and every sync writes into them: give it its own,
        # so the loaded base stays the pristine starting point (export, reference, other runs)
        own = dataclasses.replace(self.loaded, state_dict={k: v.clone() for k, v in self.loaded.state_dict.items()})
        self.engine = LLMEngine(own, EngineConfig(
            kv_cache_mb=256, max_num_seqs=max(16, per_step), max_num_batched_tokens=2048,
            threads=config.threads or self.settings.resolved_threads(), linear_kernel=self.settings.linear_kernel))
        self.policy = Policy(self.loaded.config, self.loaded.state_dict, config.lora,
                             keep_reference=config.kl_beta > 0 and config.lora is None)
        self.updater = Updater(self.policy, config, {n: d.settings for n, d in self.domains.items()}, self.world)
        self.sampler = DomainSampler(self.domains, config.sampling, config.seed)
        use_bf16 = config.autocast == "bf16" or (config.autocast == "auto" and bf16_supported())
        self.autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=use_bf16)
        self.step = 0
        self.main = self.world.rank == 0
        self.monitor = TrainingMonitor()

    # -- state ------------------------------------------------------------------------------------
    def resume(self) -> bool:
        ckpts = list_checkpoints(self.run_dir)
        if not ckpts:
            return False
        step, weights, state = load_checkpoint(ckpts[-1], self.cfg)
        try:
            self.policy.load_trainable_state(weights)
            self.updater.load_state_dict(state["updater"])
            self.sampler.load_state_dict(state["sampler"])
        except (ValueError, KeyError) as exc:
            raise CheckpointError(f"checkpoint {ckpts[-1]} does not fit this run: {exc}") from None
        set_rng_state(state["rng"])
        self.step = step
        self.policy.sync_into(self.engine)
        self._truncate_metrics(step)
        if self.metrics_path.exists():  # the alarms' windows span the resume; raised ones stay raised
            self.monitor.replay(json.loads(ln) for ln in self.metrics_path.read_text().splitlines() if ln)
        return True

    def checkpoint(self) -> Path | None:
        if not self.main:
            return None
        state = {"updater": self.updater.state_dict(), "sampler": self.sampler.state_dict()}
        path = save_checkpoint(self.run_dir, self.step, self.cfg, self.policy.trainable_state(), state,
                               self.cfg.keep_checkpoints)
        self.on_event(TrainEvent("checkpoint", self.step, {"path": str(path)}))
        return path

    @property
    def metrics_path(self) -> Path:
        return self.run_dir / "metrics.jsonl"

    def _truncate_metrics(self, step: int) -> None:
        for path in (self.metrics_path, self.alarms_path):
            if not self.main or not path.exists():
                continue
            keep = [ln for ln in path.read_text().splitlines() if ln and json.loads(ln)["step"] <= step]
            path.write_text("".join(ln + "\n" for ln in keep))

    @property
    def alarms_path(self) -> Path:
        return self.run_dir / "alarms.jsonl"

    def alarm(self, findings: list) -> None:
        """Training-time alarms (inspect/monitor.py): an "alarm" event each, and alarms.jsonl."""
        for f in findings:
            data = {"step": self.step, **f.to_json()}
            if self.main:
                with self.alarms_path.open("a") as fh:
                    fh.write(json.dumps(data) + "\n")
            self.on_event(TrainEvent("alarm", self.step, data))

    # -- one step ---------------------------------------------------------------------------------
    def _shard(self, samples: list) -> list:
        return samples[self.world.rank::self.world.size]

    def collect(self) -> tuple[list[Group], list[Group], RolloutStats]:
        """This rank's groups with reward signal, every group generated (for metrics), and stats."""
        cfg = self.cfg
        want = cfg.prompts_per_step
        samples = self.sampler.draw(want, cover=cfg.covers_domains)
        kept: list[Group] = []
        seen: list[Group] = []
        stats = RolloutStats()
        first = 0
        for round_ in range(cfg.max_refill_rounds + 1 if cfg.dynamic_sampling else 1):
            mine = self._shard(samples)
            groups, st = generate_groups(self.engine, mine, self.domains, cfg.group_size, seed=cfg.seed,
                                         step=self.step, first_prompt=first + self.world.rank * 1000)
            stats.add(st)
            seen += groups
            first += len(samples)
            if cfg.dynamic_sampling:
                groups = [g for g, ok in zip(groups, has_signal(torch.stack([g.rewards() for g in groups])))
                          if ok] if groups else []
            kept += groups
            # every rank must agree on refills: the sampler's state is shared
            have = self.world.all_reduce(torch.tensor([float(len(kept))]))
            deficit = want - int(have.item())
            if not cfg.dynamic_sampling or deficit <= 0 or round_ == cfg.max_refill_rounds:
                break
            samples = self.sampler.draw(deficit)
        return kept[: max(1, -(-want // self.world.size))], seen, stats

    def train_step(self) -> dict:
        t0 = time.perf_counter()
        kept, seen, stats = self.collect()
        items = items_from_groups(kept, self.cfg.scale_rewards)
        t1 = time.perf_counter()
        with self.autocast:
            upd = self.updater.step(items)
        t2 = time.perf_counter()
        sync = self.policy.sync_into(self.engine)
        self.step += 1
        # rewards of every rank: the sampler's state must stay the same on all of them
        names = list(self.domains)
        sums = torch.zeros(2, len(names), dtype=torch.float64)
        lengths = []
        # share of distinct completions per group: collapse as seen in the text (entropy: in the logits)
        distinct = [len({c.text for c in g.completions}) / len(g.completions) for g in seen if g.completions]
        for g in seen:
            for c in g.completions:
                sums[0, names.index(g.domain)] += c.reward
                sums[1, names.index(g.domain)] += 1
                lengths.append(len(c.completion_ids))
        sums = self.world.all_reduce(sums)
        per_domain = {n: float(sums[0, i] / sums[1, i]) for i, n in enumerate(names) if sums[1, i] > 0}
        self.sampler.observe(per_domain)
        m = {"step": self.step, "loss": upd["loss"], "reward": float(sums[0].sum() / sums[1].sum().clamp_min(1)),
             **{f"reward_{d}": v for d, v in per_domain.items()},
             "groups": len(seen), "groups_kept": len(kept), "tokens": upd["tokens"],
             "clip_frac": upd["clipped"] / max(1, upd["tokens"]), "kl": upd["kl_sum"] / max(1, upd["tokens"]),
             "entropy": upd["entropy_sum"] / max(1, upd["tokens"]),
             "grad_norm": upd["grad_norm"],
             "lr": self.updater.schedulers[next(iter(self.updater.schedulers))].get_last_lr()[0],
             "completion_len": sum(lengths) / max(1, len(lengths)), "rollout_s": stats.seconds,
             "distinct_frac": sum(distinct) / max(1, len(distinct)),
             "score_s": stats.score_seconds, "rollout_tokens_per_s": stats.tokens_per_s,
             "cached_tokens": stats.cached_tokens, "prompt_tokens": stats.prompt_tokens,
             "update_s": t2 - t1, "sync_s": sync.seconds, "step_s": time.perf_counter() - t0,
             "scorer_errors": stats.scorer_errors, "scorer_error_examples": stats.errors,
             "sampling_weights": self.sampler.weights()}
        every = self.cfg.eval_every
        if self.main and every and self.step % every == 0 and self.step < self.cfg.steps:  # the last: eval_after
            m.update(self._periodic_eval())
        alarms = self.monitor.observe(self.step, m)
        m["alarms"] = [a.check for a in alarms]
        if self.main:
            with self.metrics_path.open("a") as f:
                f.write(json.dumps(m) + "\n")
        self.on_event(TrainEvent("step", self.step, m))
        self.alarm(alarms)
        return m


    def _periodic_eval(self) -> dict[str, float]:
        """`heldout_<domain>` means of a greedy held-out eval: the monitor's independent metric."""
        from mainspring.train.evaluate import evaluate

        t0 = time.perf_counter()
        evals, _ = evaluate(self.engine, self.domains, self.cfg.eval_size)
        self.on_event(TrainEvent("eval", self.step,
                                 {"phase": "periodic", **{k: v.to_dict() for k, v in evals.items()}}))
        return {**{f"heldout_{k}": v.mean for k, v in evals.items()}, "eval_s": time.perf_counter() - t0}


def run_training(config: TrainConfig, run_dir: Path, *, resume: bool = False, domains: dict[str, Domain] | None = None,
                 on_event: OnEvent | None = None, should_stop: ShouldStop | None = None,
                 settings: Settings | None = None, loaded=None) -> TrainResult:
    """Train, evaluate, gate and export; see events.py for what `on_event` receives."""
    threads = torch.get_num_threads()
    try:
        return _run(config, Path(run_dir), resume, domains, on_event, should_stop, settings, loaded)
    finally:
        torch.set_num_threads(threads)  # the run's thread count is its own, not the caller's


def _run(config: TrainConfig, run_dir: Path, resume: bool, domains, on_event, should_stop, settings,
         loaded) -> TrainResult:
    from mainspring.train.evaluate import compare, evaluate, gate
    from mainspring.train.export import export_model
    from mainspring.train.report import write_report

    run_dir.mkdir(parents=True, exist_ok=True)
    emit = on_event or (lambda e: None)
    t = Trainer(config, run_dir, domains=domains, on_event=emit, settings=settings, loaded=loaded)
    resumed = t.resume() if resume else False
    if not resumed and t.main:
        for stale in (t.metrics_path, t.alarms_path):
            stale.unlink(missing_ok=True)
        (run_dir / "config.json").write_text(config.model_dump_json(indent=2))
    emit(TrainEvent("started", t.step, {"resumed": resumed, "trainable_params": t.policy.num_trainable(),
                                         "domains": list(t.domains), "run_dir": str(run_dir),
                                         "mixed": t.mixed.to_dict() if t.mixed else None}))
    if t.mixed is not None and t.main:
        (run_dir / "routing.json").write_text(json.dumps(t.mixed.to_dict(), indent=2))
    result = TrainResult(run_dir, t.step, False)
    before_path = run_dir / "eval_before.json"
    before = None
    if config.eval_before and t.main:
        if before_path.exists() and resumed:
            before = _load_eval(before_path)
        else:
            before, _ = evaluate(t.engine, t.domains, config.eval_size)
            before_path.write_text(json.dumps({k: v.to_dict() for k, v in before.items()}, indent=2))
        emit(TrainEvent("eval", t.step, {"phase": "before", **{k: v.to_dict() for k, v in before.items()}}))
        t.monitor.observe_eval(0, {k: v.mean for k, v in before.items()})
    checkpoints = []
    while t.step < config.steps:
        if should_stop is not None and should_stop():
            p = t.checkpoint()
            checkpoints += [p] if p else []
            result.stopped = True
            break
        t.train_step()
        if t.step % config.checkpoint_every == 0 or t.step == config.steps:
            p = t.checkpoint()
            checkpoints += [p] if p else []
    result.steps_done, result.checkpoints = t.step, [p for p in checkpoints if p.exists()]
    if result.stopped or not t.main:
        return result
    changes = None
    if config.eval_after:
        after, _ = evaluate(t.engine, t.domains, config.eval_size)
        (run_dir / "eval_after.json").write_text(json.dumps({k: v.to_dict() for k, v in after.items()}, indent=2))
        result.eval_after = {k: v.to_dict() for k, v in after.items()}
        emit(TrainEvent("eval", t.step, {"phase": "after", **result.eval_after}))
        t.alarm(t.monitor.observe_eval(t.step, {k: v.mean for k, v in after.items()}))
        if before is not None:
            changes = compare(before, after, config.seed)
            verdict = gate(changes, config.gate_delta)
            result.gate_passed = verdict.passed
            (run_dir / "changes.json").write_text(json.dumps({k: c.to_dict() for k, c in changes.items()}, indent=2))
            emit(TrainEvent("gate", t.step, {"passed": verdict.passed, "delta": verdict.delta,
                                              "regressions": verdict.regressions,
                                              "changes": {k: c.to_dict() for k, c in changes.items()}}))
    if before is not None:
        result.eval_before = {k: v.to_dict() for k, v in before.items()}
    if config.export and result.gate_passed is not False:
        meta = {"base": t.loaded.name, "suffix": config.suffix, "steps": t.step, "run_dir": str(run_dir),
                "lora": config.lora is not None}
        result.export_dir = export_model(t.policy, t.loaded, run_dir / "export", meta)
        emit(TrainEvent("export", t.step, {"path": str(result.export_dir)}))
    write_report(run_dir)
    emit(TrainEvent("finished", t.step, {"gate_passed": result.gate_passed,
                                          "export_dir": str(result.export_dir) if result.export_dir else None}))
    return result


def _load_eval(path: Path):
    from mainspring.train.evaluate import DomainEval

    raw = json.loads(path.read_text())
    return {k: DomainEval(k, v["scores"], v["mean"], tuple(v["ci"]), v["mean_length"]) for k, v in raw.items()}

"""`mainspring train CONFIG.yaml [--resume] [--out DIR]`: a GRPO run with live progress."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from mainspring.console import fail
from mainspring.train.events import TrainEvent, TrainResult

if TYPE_CHECKING:
    from mainspring.train.config import TrainConfig
    from mainspring.train.domains.base import Domain

err = Console(stderr=True, soft_wrap=True)


def _summary(e: TrainEvent) -> str:
    d = e.data
    rewards = " ".join(f"{k[7:]}={v:.2f}" for k, v in d.items() if k.startswith("reward_"))
    kl = f" kl={d['kl']:.4f}" if d.get("kl") else ""
    errors = f" scorer-fail={d['scorer_errors']}" if d.get("scorer_errors") else ""
    return f"{rewards}{kl} loss={d['loss']:+.4f} {d['rollout_tokens_per_s']:.0f} tok/s{errors}"


@contextmanager
def _distributed() -> Iterator[int]:
    """Under torchrun, join its process group (torch reads the launcher's variables itself) for the
    run, and yield this process's rank (0 when not launched by torchrun).

    A run that ends well leaves the group: a process that exits with its gloo or NCCL group still up
    can abort in the group's native threads ("terminate called without an active exception"), and
    torchrun then calls the whole run failed. The barrier first keeps one rank from tearing down its
    connections while a peer still finishes. A rank that fails leaves without either, as torchtitan
    does: a teardown can wait forever on a peer that is stuck in a collective.

    The policy trains on the CPU even where a GPU is visible, so CPU tensors always go over gloo
    (NCCL refuses them); NCCL is added for CUDA tensors where torch has it."""
    import torch
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_torchelastic_launched() or dist.is_initialized():
        yield dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        return
    gpu = torch.cuda.is_available() and dist.is_nccl_available()
    dist.init_process_group("cpu:gloo,cuda:nccl" if gpu else "gloo")
    yield dist.get_rank()
    # the barrier: a CPU all-reduce goes over gloo, where dist.barrier() would take NCCL on the current GPU
    # (every rank on GPU 0 when several share one, which NCCL refuses)
    dist.all_reduce(torch.zeros(1))
    dist.destroy_process_group()


def _train_with_progress(cfg: TrainConfig, run_dir: Path, resume: bool, domains: dict[str, Domain] | None,
                         rank: int) -> TrainResult:
    """Run the training under a progress bar (rank 0's only); an expected failure is a CLI error."""
    from mainspring.engine.errors import EngineError
    from mainspring.train.checkpoint import CheckpointError
    from mainspring.train.config import TrainConfigError
    from mainspring.train.domains.base import DomainError
    from mainspring.train.trainer import run_training

    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("eta"), TimeRemainingColumn(), TextColumn("{task.fields[info]}"))
    with Progress(*columns, console=err, transient=False, disable=rank != 0) as bar:
        task = bar.add_task("loading", total=cfg.steps, info="")

        def on_event(e: TrainEvent) -> None:
            if e.kind == "started":
                bar.update(task, description="training", completed=e.step,
                           info=f"{e.data['trainable_params']:,} trainable params")
            elif e.kind == "step":
                bar.update(task, completed=e.step, info=_summary(e))
            elif e.kind == "eval":
                means = " ".join(f"{k}={v['mean']:.2f}" for k, v in e.data.items() if isinstance(v, dict))
                bar.console.print(f"eval {e.data['phase']} (step {e.step}): {means}")
            elif e.kind == "gate":
                word = "[green]passed[/green]" if e.data["passed"] else "[red]refused export[/red]"
                bar.console.print(f"no-regression gate (delta {e.data['delta']}): {word} {e.data['regressions'] or ''}")
            elif e.kind == "export":
                bar.console.print(f"exported: {e.data['path']}")

        try:
            result = run_training(cfg, run_dir, resume=resume, on_event=on_event, domains=domains)
        except (TrainConfigError, DomainError, CheckpointError, EngineError, ValueError) as exc:
            fail(str(exc))
    return result


def train_cmd(
    config: Path = typer.Argument(..., help="the run's YAML config (see docs/train.md)"),
    resume: bool = typer.Option(False, "--resume", help="continue from the newest checkpoint in the run folder"),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="run folder; default <data dir>/train/<config name>"),
    no_inspect: bool = typer.Option(False, "--no-inspect", help="skip the model-free inspection of the domains "
                                                                 "(an error finding stops the run)"),
) -> None:
    """Train a model on its domains with GRPO, evaluate before/after, gate, export, report."""
    from mainspring.config import get_settings
    from mainspring.train.config import TrainConfig, TrainConfigError

    try:
        cfg = TrainConfig.load(config)
    except TrainConfigError as exc:
        fail(str(exc))
    with _distributed() as rank:
        run_dir = out or get_settings().data_dir / "train" / config.stem
        if not resume and (run_dir / "checkpoints").is_dir() and any((run_dir / "checkpoints").iterdir()):
            fail(f"{run_dir} already holds a run: pass --resume to continue it, or --out for a new folder")
        domains = None
        if not no_inspect:
            from mainspring.train.inspect.cli import gate_training

            domains = gate_training(cfg, run_dir, quiet=rank != 0)
        result = _train_with_progress(cfg, run_dir, resume, domains, rank)
    if rank != 0:
        return
    typer.echo(f"run folder: {result.run_dir}  (report: {result.run_dir / 'report.md'})")
    if result.gate_passed is False:
        raise typer.Exit(1)

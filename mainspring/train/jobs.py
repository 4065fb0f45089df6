"""FineTuningRunner: runs fine-tuning jobs one at a time on a background thread of the API server.

Durable: the database is the truth. The runner takes the oldest pending job (a `running` one first:
it was cut off by a restart), runs it in its own folder (`<data_dir>/fine_tuning/<job id>`), and writes
what the trainer reports (events, checkpoints, tokens) as it arrives. On a server start, a job left
`running` resumes from its newest checkpoint (`resume=True`); one that never reached a checkpoint starts
over. A job restarted MAX_ATTEMPTS times fails instead of looping.

Cancel and pause are the job's status: the route sets `cancelled` or `paused`, and `should_stop` (polled by
the trainer between steps) sees it; the trainer checkpoints and returns, as on a shutdown, which leaves the
job `running` for the next start. A paused job is not pending: it waits, across restarts too, until a resume
sets it `queued`, and then continues from its newest checkpoint like a restarted one. On success the
exported folder moves to `Settings.finetuned_path / <model id>`, where the API serves it.

`results` (given by the API, which owns the Files store) writes the job's per-step metrics CSV as a file:
after every checkpoint, so a paused or failed job has one too, and once more before the job succeeds.

One runner per database: two server processes on one database would both run the same job.
"""

from __future__ import annotations

import json
import logging
import shutil
import threading
import time
from pathlib import Path
from typing import Any, Callable

from sqlalchemy import case, select
from sqlalchemy.engine import Engine

from mainspring.config import Settings
from mainspring.store.data_policy import get_policy
from mainspring.store.db import session
from mainspring.store.tables import FileRow, FineTuningJobRow
from mainspring.train import job_store
from mainspring.train.config import TrainConfig, TrainConfigError
from mainspring.train.domains.base import DomainError, DomainSettings
from mainspring.train.events import TrainEvent, TrainResult
from mainspring.train.graders import GraderError, parse_grader
from mainspring.train.job_events import JobEvents
from mainspring.train.rft_data import DataFileError, job_domain

log = logging.getLogger(__name__)

TrainFn = Callable[..., TrainResult]  # mainspring.train.trainer.run_training's signature
POLL_S = 1.0
STOP_POLL_S = 1.0  # the database is asked about a cancel at most this often
STOP_TIMEOUT_S = 120.0  # a shutdown waits this long for the trainer to checkpoint and return
MAX_ATTEMPTS = 5


def real_train_fn() -> TrainFn:
    from mainspring.train.trainer import run_training  # torch and the trainer load only when a job runs

    return run_training


class FineTuningRunner:
    def __init__(self, settings: Settings, db: Engine, *, train_fn: TrainFn | None = None, sandbox: Any = None,
                 poll_s: float = POLL_S, results: Callable[[str], Any] | None = None) -> None:
        self.settings, self.db, self.sandbox, self.poll_s = settings, db, sandbox, poll_s
        self._train_fn = train_fn
        self._results = results
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.current: str | None = None  # the job being trained, if any

    # ---- lifecycle -------------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="fine-tuning-runner", daemon=True)
        self._thread.start()

    def notify(self) -> None:
        self._wake.set()

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """Ask the job in progress to checkpoint and return (it stays `running`, resumed on the next start)."""
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("fine-tuning job %s did not stop within %.0f s; it resumes from its last checkpoint "
                            "on the next start", self.current, timeout)

    def _loop(self) -> None:
        while not self._stopping.is_set():
            try:
                job_id = self._next()
            except Exception:  # the database is unreachable for a moment: try again later
                log.exception("fine-tuning runner: cannot read the jobs")
                job_id = None
            if job_id is None:
                self._wake.wait(self.poll_s)
                self._wake.clear()
                continue
            self.current = job_id
            # each job trains on a thread of its own: torch's thread pool goes with the thread when the job
            # ends, leaving the serving engines' compute thread the process's only one (mainspring/compute.py)
            job = threading.Thread(target=self._run_guarded, args=(job_id,), name=f"fine-tuning-{job_id}",
                                   daemon=True)
            job.start()
            job.join()

    def _run_guarded(self, job_id: str) -> None:
        try:
            self._run(job_id)
        except Exception as exc:  # a bug here must fail the job, not loop on it or kill the runner
            log.exception("fine-tuning job %s failed", job_id)
            job_store.fail(self.db, job_id, "internal_error", f"{type(exc).__name__}: {exc}")
        finally:
            self.current = None

    def _next(self) -> str | None:
        with session(self.db, readonly=True) as s:
            return s.scalar(select(FineTuningJobRow.id).where(FineTuningJobRow.status.in_(job_store.PENDING))
                            .order_by(case((FineTuningJobRow.status == "running", 0), else_=1),
                                      FineTuningJobRow.created_at, FineTuningJobRow.id).limit(1))

    # ---- one job ---------------------------------------------------------------------------------------
    def _run(self, job_id: str) -> None:
        row = job_store.load(self.db, job_id)
        if row is None or row.status not in job_store.PENDING:
            return
        if not self._training_allowed(row):  # the API refuses such a job; a policy set after creation stops it here
            job_store.fail(self.db, job_id, "training_not_allowed", "the project's data policy forbids training on "
                           "its data (mainspring projects set <project> --training allows it)")
            return
        if row.attempts >= MAX_ATTEMPTS:
            job_store.fail(self.db, job_id, "too_many_restarts",
                           f"the job was interrupted {row.attempts} times without finishing")
            return
        # a later attempt always asks to resume: the trainer continues from its newest checkpoint in the
        # run folder, or starts over when the first attempt never wrote one
        resume = row.attempts > 0
        note = self._start_note(row, resume)
        if not job_store.move(self.db, job_id, job_store.PENDING, "running", message=note,
                              attempts=row.attempts + 1, started_at=row.started_at or job_store.now()):
            return  # cancelled meanwhile
        try:
            config, domain = self._prepare(row)
        except DataFileError as exc:
            job_store.fail(self.db, job_id, "invalid_file", str(exc), exc.param)
            return
        except (DomainError, GraderError, TrainConfigError, ValueError) as exc:
            job_store.fail(self.db, job_id, "invalid_job", str(exc))
            return
        run_dir = self.settings.data_dir / "fine_tuning" / job_id
        run_dir.mkdir(parents=True, exist_ok=True)
        events = JobEvents(self.db, job_id, config.steps, self.settings.data_dir)

        def on_event(ev: TrainEvent) -> None:
            events(ev)
            if ev.kind == "checkpoint":  # a checkpoint is every few steps: cheap enough to rewrite the CSV
                self._write_results(job_id)

        train = self._train_fn or real_train_fn()
        try:
            result = train(config, run_dir, resume=resume, domains={job_store.DOMAIN: domain}, on_event=on_event,
                           should_stop=self._stop_check(job_id), settings=self.settings)
        except (TrainConfigError, DomainError) as exc:  # what the trainer refuses to run is the job's fault
            job_store.fail(self.db, job_id, "invalid_job", str(exc))
            return
        except Exception as exc:
            log.exception("fine-tuning job %s: training failed", job_id)
            job_store.fail(self.db, job_id, "training_failed", f"{type(exc).__name__}: {exc}")
            return
        self._finish(job_id, result, events)

    def _training_allowed(self, row: FineTuningJobRow) -> bool:
        with session(self.db, readonly=True) as s:
            return get_policy(s, row.project_id).training_allowed

    def _start_note(self, row: FineTuningJobRow, resume: bool) -> str:
        if not resume:
            return "Fine-tuning job started"
        saved = job_store.checkpoints(self.db, row.id)
        # a started job is back in `queued` only through a resume; a restart leaves it `running`
        why = "after the job was resumed" if row.status == "queued" else "after a restart"
        if saved:
            return f"Resuming {why} from the checkpoint at step {saved[-1].step_number}"
        return f"Restarting from the beginning {why} (no checkpoint had been written)"

    def _write_results(self, job_id: str) -> None:
        if self._results is None:
            return
        try:
            self._results(job_id)
        except Exception:  # the metrics file is a by-product: it must never fail the training
            log.exception("fine-tuning job %s: cannot write the result file", job_id)

    def _prepare(self, row: FineTuningJobRow):
        config = TrainConfig.parse(json.loads(row.config_json), "the job's config")
        method = json.loads(row.method_json)
        grader = parse_grader(method["reinforcement"]["grader"])
        spec = config.domains[0]
        knobs = {k: getattr(spec, k) for k in ("max_tokens", "temperature") if getattr(spec, k) is not None}
        domain = job_domain(job_store.DOMAIN, self._file(row.training_file, "training_file"),
                            self._file(row.validation_file, "validation_file") if row.validation_file else None,
                            grader, settings=DomainSettings(**knobs), sandbox=self.sandbox)
        return config, domain

    def _file(self, file_id: str, param: str) -> Path:
        with session(self.db, readonly=True) as s:
            f = s.get(FileRow, file_id)
        if f is None:
            raise DataFileError(param, f"the {param} {file_id} no longer exists")
        return self.settings.data_dir / f.path

    def _stop_check(self, job_id: str) -> Callable[[], bool]:
        asked_at, stop = 0.0, False  # when the database was last asked, and what it said

        def should_stop() -> bool:
            nonlocal asked_at, stop
            if self._stopping.is_set() or stop:
                return True
            if time.monotonic() - asked_at >= STOP_POLL_S:
                asked_at = time.monotonic()
                row = job_store.load(self.db, job_id)
                stop = row is None or row.status != "running"
            return stop

        return should_stop

    def _finish(self, job_id: str, result: TrainResult, events: JobEvents) -> None:
        row = job_store.load(self.db, job_id)
        if row is None or row.status == "cancelled":
            job_store.event(self.db, job_id, f"Training stopped at step {result.steps_done} (cancelled)")
            with session(self.db) as s:
                job = s.get(FineTuningJobRow, job_id)
                if job is not None:  # a job deleted while it trained has nothing to stamp
                    job.finished_at = job_store.now()
            return
        if row.status == "paused":  # the trainer left its checkpoint (or finished): a resume continues from it
            job_store.event(self.db, job_id, f"Training paused at step {result.steps_done}; resume the job to "
                            "continue from its checkpoint")
            return
        if result.stopped:  # a shutdown: stays running, resumed by the next start
            job_store.event(self.db, job_id, f"Paused at step {result.steps_done} by a server shutdown; the job "
                            "resumes when the server starts again")
            return
        export = result.export_dir or events.exported
        if export is None or not Path(export).is_dir():
            reason = ("the evaluation gate refused the export" if result.gate_passed is False
                      else "no model was exported")
            job_store.fail(self.db, job_id, "export_refused", f"{reason} (after {result.steps_done} steps); "
                           "see the job's events for the evaluation")
            return
        model_id = job_store.model_name(row.model, row.suffix, job_id)
        self._write_results(job_id)  # before `succeeded`: whoever sees the status sees the whole file
        dest = self.publish(Path(export), model_id)
        if not job_store.move(self.db, job_id, ("running",), "succeeded", fine_tuned_model=model_id,
                              finished_at=job_store.now(), estimated_finish=None,
                              message=(f"New fine-tuned model created: {model_id}",
                                       "The job has successfully completed")):
            shutil.rmtree(dest, ignore_errors=True)  # cancelled in the last moment: the model is not served

    def publish(self, export: Path, model_id: str) -> Path:
        """Move the exported folder to where the API serves models from, named by the model id."""
        root = self.settings.finetuned_path
        root.mkdir(parents=True, exist_ok=True)
        dest = root / model_id
        tmp = root / f".tmp-{model_id}"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.move(str(export), str(tmp))  # a rename on one file system; a copy across them
        shutil.rmtree(dest, ignore_errors=True)  # a rerun of a job that published before a crash
        tmp.rename(dest)
        return dest

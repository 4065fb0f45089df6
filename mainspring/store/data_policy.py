"""A project's data policy: may its data be trained on, may it leave the machine, how long is it kept.

Three columns on `projects` (migration 0011), read here as one frozen `DataPolicy`:

* `training_allowed` (default True): False means the project's stored prompts and outputs are never used for
  training: fine-tuning jobs are refused at creation and again when the trainer starts them, and training-data
  exports of its outputs are refused.
* `local_only` (default False): True means no upstream (non-embedded) model may receive the project's data; the
  API refuses such a model for the project's keys, and the agent runtime refuses it when a run resolves it.
* `retention_days` (default None = keep): stored prompts and outputs older than this are swept
  (mainspring/store/retention.py). The ledger, usage and audit trail are books and records: never swept.

A caller without a project (an anonymous key where keys are optional) gets the default policy. It sits in the
store layer so every layer above (api, train, agents, the CLI) asks the same question the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from sqlalchemy import select
from sqlalchemy.orm import Session

from mainspring.store.tables import Project

MAX_RETENTION_DAYS = 36_500  # a hundred years: anything longer is a typo for "keep"


class PolicyError(ValueError):
    """Bad input to the policy (unknown project, retention out of range)."""


@dataclass(frozen=True)
class DataPolicy:
    training_allowed: bool = True
    local_only: bool = False
    retention_days: int | None = None  # None: keep stored prompts and outputs

    @classmethod
    def of(cls, project: Project) -> DataPolicy:
        # a row made before 0011 ran in this process, or not yet flushed, may hold None: the defaults then
        return cls(training_allowed=project.training_allowed is not False, local_only=bool(project.local_only),
                   retention_days=project.retention_days)


DEFAULT_POLICY: Final = DataPolicy()


class _Unchanged:
    """The `retention_days` of set_policy() when not given (None already means "keep")."""

    def __repr__(self) -> str:
        return "UNCHANGED"


UNCHANGED: Final = _Unchanged()


def get_policy(session: Session, project_id: int | None) -> DataPolicy:
    """The policy of a project by id; the default one for no project (or one that no longer exists)."""
    if project_id is None:
        return DEFAULT_POLICY
    project = session.get(Project, project_id)
    return DataPolicy.of(project) if project is not None else DEFAULT_POLICY


def find_project(session: Session, name: str) -> Project:
    project = session.scalar(select(Project).where(Project.name == name))
    if project is None:
        raise PolicyError(f"no project {name!r}; projects are made by `mainspring keys create --project {name}`")
    return project


def check_retention(days: int | None) -> int | None:
    if days is not None and not 1 <= days <= MAX_RETENTION_DAYS:
        raise PolicyError(f"retention_days {days} is out of range: 1 to {MAX_RETENTION_DAYS} days, or none to keep")
    return days


def set_policy(session: Session, project_id: int, *, training_allowed: bool | None = None,
               local_only: bool | None = None,
               retention_days: int | None | _Unchanged = UNCHANGED) -> DataPolicy:
    """Change the settings given (None / UNCHANGED leave one as it is); returns the policy now in force."""
    project = session.get(Project, project_id)
    if project is None:
        raise PolicyError(f"no project with id {project_id}")
    if training_allowed is not None:
        project.training_allowed = training_allowed
    if local_only is not None:
        project.local_only = local_only
    if not isinstance(retention_days, _Unchanged):
        project.retention_days = check_retention(retention_days)
    session.flush()
    return DataPolicy.of(project)

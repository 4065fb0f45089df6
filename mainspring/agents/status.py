"""The states of runs, steps, tool calls and interrupts. Values are the strings stored and shown by the API."""

from __future__ import annotations

from enum import StrEnum


class RunStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"  # a worker holds its lease
    WAITING_APPROVAL = "waiting_approval"  # parked until a human decides on a tool call
    PAUSED = "paused"  # by a user, a budget or a stopped model (pause_reason)
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"


# pause_reason of a run parked because its model's engine stopped; a worker that starts queues it again
MODEL_STOPPED = "model_stopped"

TERMINAL = frozenset({RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.TIMED_OUT})


class StepStatus(StrEnum):
    STARTED = "started"  # journaled before the model is called; still open after a crash
    COMPLETED = "completed"


class ToolCallStatus(StrEnum):
    PENDING = "pending"
    WAITING_APPROVAL = "waiting_approval"
    APPROVED = "approved"
    RUNNING = "running"  # its side effect may have happened
    COMPLETED = "completed"
    FAILED = "failed"
    REJECTED = "rejected"
    CANCELLED = "cancelled"


# calls whose result may still come, and calls whose result the model sees
OPEN_CALLS = frozenset({ToolCallStatus.PENDING, ToolCallStatus.APPROVED, ToolCallStatus.RUNNING,
                        ToolCallStatus.WAITING_APPROVAL})
ANSWERED_CALLS = frozenset({ToolCallStatus.COMPLETED, ToolCallStatus.FAILED, ToolCallStatus.REJECTED})


class InterruptStatus(StrEnum):
    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"
    EDITED = "edited"
    EXPIRED = "expired"

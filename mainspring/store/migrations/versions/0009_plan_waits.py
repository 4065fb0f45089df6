"""Plan coordination: plan_messages (task-to-task mail), plan_waits (the wait-for graph's edges), deadlocks
(detected wait-for cycles and handoff livelocks); plan_tasks.agent_override and plan_tasks.handoffs (handoffs);
runs.parent_run_id (a run started by another's ask_agent call).

Frozen like 0001–0008; tests/store/test_db.py checks that models and migrations agree.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "plan_messages",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("plan_id", sa.String(64), nullable=False),
        sa.Column("from_task", sa.String(96), nullable=False),
        sa.Column("to_task", sa.String(96), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("sent_by_call", sa.String(64), nullable=False),
        sa.Column("taken_by_call", sa.String(64), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_plan_messages"),
        sa.ForeignKeyConstraint(["plan_id"], ["plans.id"], name="fk_plan_messages_plan_id_plans"),
        sa.UniqueConstraint("sent_by_call", name="uq_plan_messages_sent_by_call"),
        sa.UniqueConstraint("taken_by_call", name="uq_plan_messages_taken_by_call"),
    )
    op.create_index("ix_plan_messages_inbox", "plan_messages", ["plan_id", "to_task", "from_task"])

    op.create_table(
        "plan_waits",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("plan_id", sa.String(64), nullable=False),
        sa.Column("call_id", sa.String(64), nullable=False),
        sa.Column("waiter", sa.String(96), nullable=False),
        sa.Column("target", sa.String(96), nullable=False),
        sa.Column("run_id", sa.String(64), nullable=False),
        sa.Column("since", sa.DateTime(), nullable=False),
        sa.Column("deadline_at", sa.DateTime(), nullable=False),
        sa.Column("ended_at", sa.DateTime(), nullable=True),
        sa.Column("outcome", sa.String(24), nullable=True),
        sa.Column("detail", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_plan_waits"),
        sa.ForeignKeyConstraint(["plan_id"], ["plans.id"], name="fk_plan_waits_plan_id_plans"),
        sa.UniqueConstraint("call_id", name="uq_plan_waits_call_id"),
    )
    op.create_index("ix_plan_waits_open", "plan_waits", ["ended_at"])

    op.create_table(
        "deadlocks",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("plan_id", sa.String(64), nullable=False),
        sa.Column("project_id", sa.Integer(), nullable=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("cycle_json", sa.Text(), nullable=False),
        sa.Column("wait_ids_json", sa.Text(), nullable=False),
        sa.Column("policy", sa.String(24), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("victim", sa.String(96), nullable=True),
        sa.Column("resolution", sa.Text(), nullable=True),
        sa.Column("detected_at", sa.DateTime(), nullable=False),
        sa.Column("resolved_at", sa.DateTime(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_deadlocks"),
        sa.ForeignKeyConstraint(["plan_id"], ["plans.id"], name="fk_deadlocks_plan_id_plans"),
        sa.ForeignKeyConstraint(["project_id"], ["projects.id"], name="fk_deadlocks_project_id_projects"),
    )
    op.create_index("ix_deadlocks_project_detected", "deadlocks", ["project_id", "detected_at"])

    with op.batch_alter_table("plan_tasks") as b:
        b.add_column(sa.Column("agent_override", sa.String(100), nullable=True))
        b.add_column(sa.Column("handoffs", sa.Integer(), nullable=False, server_default="0"))
    with op.batch_alter_table("runs") as b:
        b.add_column(sa.Column("parent_run_id", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as b:
        b.drop_column("parent_run_id")
    with op.batch_alter_table("plan_tasks") as b:
        b.drop_column("handoffs")
        b.drop_column("agent_override")
    op.drop_index("ix_deadlocks_project_detected", table_name="deadlocks")
    op.drop_table("deadlocks")
    op.drop_index("ix_plan_waits_open", table_name="plan_waits")
    op.drop_table("plan_waits")
    op.drop_index("ix_plan_messages_inbox", table_name="plan_messages")
    op.drop_table("plan_messages")

"""Plans: plans (DAGs of agent tasks), plan_tasks, plan_events, and leader_leases (the one plan scheduler); and
runs.output_schema_json (a plan task's artifact schema, the run's own over its agent's).

Frozen like 0001–0005; tests/store/test_db.py checks that models and migrations agree.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "plans",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("project_id", sa.Integer(), nullable=True),
        sa.Column("api_key_id", sa.String(32), nullable=True),
        sa.Column("name", sa.String(255), nullable=True),
        sa.Column("goal", sa.Text(), nullable=False),
        sa.Column("spec_json", sa.Text(), nullable=False),
        sa.Column("status", sa.String(24), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("token_budget", sa.BigInteger(), nullable=True),
        sa.Column("cost_budget_u", sa.BigInteger(), nullable=True),
        sa.Column("prompt_tokens", sa.BigInteger(), nullable=False),
        sa.Column("completion_tokens", sa.BigInteger(), nullable=False),
        sa.Column("cost_u", sa.BigInteger(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_plans"),
        sa.ForeignKeyConstraint(["project_id"], ["projects.id"], name="fk_plans_project_id_projects"),
        sa.ForeignKeyConstraint(["api_key_id"], ["api_keys.id"], name="fk_plans_api_key_id_api_keys"),
    )
    op.create_index("ix_plans_project_created", "plans", ["project_id", "created_at"])
    op.create_index("ix_plans_status_priority", "plans", ["status", "priority"])

    op.create_table(
        "plan_tasks",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("plan_id", sa.String(64), nullable=False),
        sa.Column("project_id", sa.Integer(), nullable=True),
        sa.Column("key", sa.String(96), nullable=False),
        sa.Column("spec_key", sa.String(64), nullable=False),
        sa.Column("item_index", sa.Integer(), nullable=True),
        sa.Column("status", sa.String(24), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.String(64), nullable=True),
        sa.Column("input_json", sa.Text(), nullable=True),
        sa.Column("input_hashes_json", sa.Text(), nullable=True),
        sa.Column("artifact_json", sa.Text(), nullable=True),
        sa.Column("artifact_sha256", sa.String(64), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("ready_at", sa.DateTime(), nullable=True),
        sa.Column("dispatched_at", sa.DateTime(), nullable=True),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_plan_tasks"),
        sa.ForeignKeyConstraint(["plan_id"], ["plans.id"], name="fk_plan_tasks_plan_id_plans"),
        sa.ForeignKeyConstraint(["project_id"], ["projects.id"], name="fk_plan_tasks_project_id_projects"),
        sa.UniqueConstraint("plan_id", "key", name="uq_plan_tasks_plan_id"),
    )
    op.create_index("ix_plan_tasks_status_priority", "plan_tasks", ["status", "priority"])
    op.create_index("ix_plan_tasks_plan_status", "plan_tasks", ["plan_id", "status"])

    op.create_table(
        "plan_events",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("plan_id", sa.String(64), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("type", sa.String(64), nullable=False),
        sa.Column("task_key", sa.String(96), nullable=True),
        sa.Column("data_json", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_plan_events"),
        sa.ForeignKeyConstraint(["plan_id"], ["plans.id"], name="fk_plan_events_plan_id_plans"),
        sa.UniqueConstraint("plan_id", "seq", name="uq_plan_events_plan_id"),
    )

    op.create_table(
        "leader_leases",
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("owner", sa.String(128), nullable=False),
        sa.Column("expires_at", sa.DateTime(), nullable=False),
        sa.Column("acquired_at", sa.DateTime(), nullable=False),
        sa.Column("term", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_leader_leases"),
    )
    with op.batch_alter_table("runs") as b:
        b.add_column(sa.Column("output_schema_json", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as b:
        b.drop_column("output_schema_json")
    op.drop_table("leader_leases")
    op.drop_table("plan_events")
    op.drop_index("ix_plan_tasks_plan_status", table_name="plan_tasks")
    op.drop_index("ix_plan_tasks_status_priority", table_name="plan_tasks")
    op.drop_table("plan_tasks")
    op.drop_index("ix_plans_status_priority", table_name="plans")
    op.drop_index("ix_plans_project_created", table_name="plans")
    op.drop_table("plans")

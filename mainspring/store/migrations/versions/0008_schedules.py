"""Schedules: schedules (cron or webhook triggers of a plan or an agent run) and schedule_fires (one row per fire,
unique per schedule and slot or delivery id: what makes a fire exactly-once).

Frozen like 0001–0007; tests/store/test_db.py checks that models and migrations agree.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-03
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "schedules",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("project_id", sa.Integer(), nullable=True),
        sa.Column("api_key_id", sa.String(32), nullable=True),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("cron", sa.String(255), nullable=True),
        sa.Column("timezone", sa.String(64), nullable=False),
        sa.Column("target_json", sa.Text(), nullable=False),
        sa.Column("secret", sa.String(128), nullable=True),
        sa.Column("enabled", sa.Boolean(), nullable=False),
        sa.Column("next_fire_at", sa.DateTime(), nullable=True),
        sa.Column("last_fired_at", sa.DateTime(), nullable=True),
        sa.Column("fire_count", sa.Integer(), nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_schedules"),
        sa.ForeignKeyConstraint(["project_id"], ["projects.id"], name="fk_schedules_project_id_projects"),
        sa.ForeignKeyConstraint(["api_key_id"], ["api_keys.id"], name="fk_schedules_api_key_id_api_keys"),
    )
    op.create_index("ix_schedules_due", "schedules", ["enabled", "next_fire_at"])
    op.create_index("ix_schedules_project_created", "schedules", ["project_id", "created_at"])

    op.create_table(
        "schedule_fires",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("schedule_id", sa.String(64), nullable=False),
        sa.Column("fire_key", sa.String(128), nullable=False),
        sa.Column("plan_id", sa.String(64), nullable=True),
        sa.Column("run_id", sa.String(64), nullable=True),
        sa.Column("body", sa.Text(), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_schedule_fires"),
        sa.ForeignKeyConstraint(["schedule_id"], ["schedules.id"], name="fk_schedule_fires_schedule_id_schedules"),
        sa.UniqueConstraint("schedule_id", "fire_key", name="uq_schedule_fires_schedule_id"),
    )
    op.create_index("ix_schedule_fires_status", "schedule_fires", ["status"])


def downgrade() -> None:
    op.drop_index("ix_schedule_fires_status", table_name="schedule_fires")
    op.drop_table("schedule_fires")
    op.drop_index("ix_schedules_project_created", table_name="schedules")
    op.drop_index("ix_schedules_due", table_name="schedules")
    op.drop_table("schedules")

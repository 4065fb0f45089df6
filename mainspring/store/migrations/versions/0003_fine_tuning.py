"""Fine-tuning jobs API: fine_tuning_jobs, fine_tuning_events, fine_tuning_checkpoints.

Frozen like 0001 and 0002 (written out, not generated at run time); tests/store/test_db.py checks that
models and migrations agree.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "fine_tuning_jobs",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("project_id", sa.Integer(), nullable=True),
        sa.Column("api_key_id", sa.String(32), nullable=True),
        sa.Column("model", sa.String(255), nullable=False),
        sa.Column("training_file", sa.String(64), nullable=False),
        sa.Column("validation_file", sa.String(64), nullable=True),
        sa.Column("suffix", sa.String(64), nullable=True),
        sa.Column("seed", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(24), nullable=False),
        sa.Column("method_json", sa.Text(), nullable=False),
        sa.Column("config_json", sa.Text(), nullable=False),
        sa.Column("metadata_json", sa.Text(), nullable=True),
        sa.Column("fine_tuned_model", sa.String(255), nullable=True),
        sa.Column("trained_tokens", sa.BigInteger(), nullable=True),
        sa.Column("error_json", sa.Text(), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("started_at", sa.DateTime(), nullable=True),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
        sa.Column("estimated_finish", sa.DateTime(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_fine_tuning_jobs"),
        sa.ForeignKeyConstraint(["project_id"], ["projects.id"], name="fk_fine_tuning_jobs_project_id_projects"),
        sa.ForeignKeyConstraint(["api_key_id"], ["api_keys.id"], name="fk_fine_tuning_jobs_api_key_id_api_keys"),
        sa.UniqueConstraint("fine_tuned_model", name="uq_fine_tuning_jobs_fine_tuned_model"),
    )
    op.create_index("ix_fine_tuning_jobs_status", "fine_tuning_jobs", ["status"])
    op.create_index("ix_fine_tuning_jobs_project_created", "fine_tuning_jobs", ["project_id", "created_at"])

    op.create_table(
        "fine_tuning_events",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(64), nullable=False),
        sa.Column("level", sa.String(8), nullable=False),
        sa.Column("type", sa.String(16), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("data_json", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_fine_tuning_events"),
        sa.ForeignKeyConstraint(["job_id"], ["fine_tuning_jobs.id"],
                                name="fk_fine_tuning_events_job_id_fine_tuning_jobs"),
    )
    op.create_index("ix_fine_tuning_events_job_id", "fine_tuning_events", ["job_id"])

    op.create_table(
        "fine_tuning_checkpoints",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("job_id", sa.String(64), nullable=False),
        sa.Column("step_number", sa.Integer(), nullable=False),
        sa.Column("path", sa.String(512), nullable=False),
        sa.Column("metrics_json", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_fine_tuning_checkpoints"),
        sa.ForeignKeyConstraint(["job_id"], ["fine_tuning_jobs.id"],
                                name="fk_fine_tuning_checkpoints_job_id_fine_tuning_jobs"),
        sa.UniqueConstraint("job_id", "step_number", name="uq_fine_tuning_checkpoints_job_step"),
    )
    op.create_index("ix_fine_tuning_checkpoints_job_id", "fine_tuning_checkpoints", ["job_id"])


def downgrade() -> None:
    op.drop_index("ix_fine_tuning_checkpoints_job_id", table_name="fine_tuning_checkpoints")
    op.drop_table("fine_tuning_checkpoints")
    op.drop_index("ix_fine_tuning_events_job_id", table_name="fine_tuning_events")
    op.drop_table("fine_tuning_events")
    op.drop_index("ix_fine_tuning_jobs_project_created", table_name="fine_tuning_jobs")
    op.drop_index("ix_fine_tuning_jobs_status", table_name="fine_tuning_jobs")
    op.drop_table("fine_tuning_jobs")

"""Responses API: stored responses (POST /v1/responses with store), scoped to a project like fine-tuning jobs.

Frozen like 0001–0004; tests/store/test_db.py checks that models and migrations agree.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-03
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "responses",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("project_id", sa.Integer(), nullable=True),
        sa.Column("api_key_id", sa.String(32), nullable=True),
        sa.Column("model", sa.String(255), nullable=False),
        sa.Column("status", sa.String(24), nullable=False),
        sa.Column("previous_response_id", sa.String(64), nullable=True),
        sa.Column("request_json", sa.Text(), nullable=False),
        sa.Column("input_json", sa.Text(), nullable=False),
        sa.Column("output_json", sa.Text(), nullable=False),
        sa.Column("usage_json", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_responses"),
        sa.ForeignKeyConstraint(["project_id"], ["projects.id"], name="fk_responses_project_id_projects"),
        sa.ForeignKeyConstraint(["api_key_id"], ["api_keys.id"], name="fk_responses_api_key_id_api_keys"),
    )
    op.create_index("ix_responses_project_created", "responses", ["project_id", "created_at"])


def downgrade() -> None:
    op.drop_index("ix_responses_project_created", table_name="responses")
    op.drop_table("responses")

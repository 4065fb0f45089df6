"""Replanning a failed task: plan_tasks.prompt_override (the planner's revised prompt) and plan_tasks.replans
(how many revisions the task has had). The new task status "replanning" needs no schema change.

Frozen like 0001–0009; tests/store/test_db.py checks that models and migrations agree.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-09
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("plan_tasks") as b:
        b.add_column(sa.Column("prompt_override", sa.Text(), nullable=True))
        b.add_column(sa.Column("replans", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("plan_tasks") as b:
        b.drop_column("replans")
        b.drop_column("prompt_override")

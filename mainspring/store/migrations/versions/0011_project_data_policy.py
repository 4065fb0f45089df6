"""A project's data policy: projects.training_allowed (its data may be trained on and exported as training data),
projects.local_only (no upstream model may receive its data) and projects.retention_days (stored prompts and
outputs older than this are swept; NULL keeps them). Existing projects keep today's behaviour: training allowed,
upstreams allowed, nothing swept.

Frozen like 0001–0010; tests/store/test_db.py checks that models and migrations agree.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-04
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("projects") as b:
        b.add_column(sa.Column("training_allowed", sa.Boolean(), nullable=False, server_default=sa.true()))
        b.add_column(sa.Column("local_only", sa.Boolean(), nullable=False, server_default=sa.false()))
        b.add_column(sa.Column("retention_days", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("projects") as b:
        b.drop_column("retention_days")
        b.drop_column("local_only")
        b.drop_column("training_allowed")

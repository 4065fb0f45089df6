"""runs.model_override: the model a run calls instead of its agent's (a plan task routed by complexity).

Frozen like 0001–0006; tests/store/test_db.py checks that models and migrations agree.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as b:
        b.add_column(sa.Column("model_override", sa.String(255), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as b:
        b.drop_column("model_override")

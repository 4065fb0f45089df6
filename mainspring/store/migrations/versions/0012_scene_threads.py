"""Scene design threads: scene_threads (POST /v1/scenes/threads), a design dialogue's state between turns, scoped
to a project like stored responses; `version` is the row version a turn is written over.

Frozen like 0001–0011; tests/store/test_db.py checks that models and migrations agree.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-05
"""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "scene_threads",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("project_id", sa.Integer(), nullable=True),
        sa.Column("api_key_id", sa.String(32), nullable=True),
        sa.Column("model", sa.String(255), nullable=False),
        sa.Column("state_json", sa.Text(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_scene_threads"),
        sa.ForeignKeyConstraint(["project_id"], ["projects.id"], name="fk_scene_threads_project_id_projects"),
        sa.ForeignKeyConstraint(["api_key_id"], ["api_keys.id"], name="fk_scene_threads_api_key_id_api_keys"),
    )
    op.create_index("ix_scene_threads_project_created", "scene_threads", ["project_id", "created_at"])


def downgrade() -> None:
    op.drop_index("ix_scene_threads_project_created", table_name="scene_threads")
    op.drop_table("scene_threads")

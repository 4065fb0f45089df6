"""Agent tenancy: agents, threads and runs belong to a project (None: anonymous, auth off); agent names are
unique per project; a run remembers the API key that created it, whose ledger and budgets its model calls use.

Frozen like 0001–0003; tests/store/test_db.py checks that models and migrations agree.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("agents") as b:
        b.add_column(sa.Column("project_id", sa.Integer(), nullable=True))
        b.drop_constraint("uq_agents_name", type_="unique")
        b.create_unique_constraint("uq_agents_project_id", ["project_id", "name", "version"])
        b.create_foreign_key("fk_agents_project_id_projects", "projects", ["project_id"], ["id"])
    with op.batch_alter_table("threads") as b:
        b.add_column(sa.Column("project_id", sa.Integer(), nullable=True))
        b.create_foreign_key("fk_threads_project_id_projects", "projects", ["project_id"], ["id"])
    with op.batch_alter_table("runs") as b:
        b.add_column(sa.Column("project_id", sa.Integer(), nullable=True))
        b.add_column(sa.Column("api_key_id", sa.String(32), nullable=True))
        b.create_foreign_key("fk_runs_project_id_projects", "projects", ["project_id"], ["id"])
        b.create_foreign_key("fk_runs_api_key_id_api_keys", "api_keys", ["api_key_id"], ["id"])
        b.create_index("ix_runs_project_created", ["project_id", "created_at"])


def downgrade() -> None:
    with op.batch_alter_table("runs") as b:
        b.drop_index("ix_runs_project_created")
        b.drop_constraint("fk_runs_api_key_id_api_keys", type_="foreignkey")
        b.drop_constraint("fk_runs_project_id_projects", type_="foreignkey")
        b.drop_column("api_key_id")
        b.drop_column("project_id")
    with op.batch_alter_table("threads") as b:
        b.drop_constraint("fk_threads_project_id_projects", type_="foreignkey")
        b.drop_column("project_id")
    with op.batch_alter_table("agents") as b:
        b.drop_constraint("fk_agents_project_id_projects", type_="foreignkey")
        b.drop_constraint("uq_agents_project_id", type_="unique")
        b.create_unique_constraint("uq_agents_name", ["name", "version"])
        b.drop_column("project_id")

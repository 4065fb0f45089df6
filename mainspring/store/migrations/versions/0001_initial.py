"""Initial schema: projects, api_keys, price_sheets, ledger_entries (append-only), budgets,
reservations, files, batches.

Written out by hand rather than from `Base.metadata` so this revision stays frozen when the models
change; tests/store/test_db.py checks models and migrations agree.

Revision ID: 0001
Revises:
Create Date: 2025-06-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

# The ledger is append-only at the database level too, so no code path (or hand-run SQL) can
# rewrite history; corrections are reversing rows.
_SQLITE_TRIGGERS = [
    "CREATE TRIGGER ledger_entries_no_update BEFORE UPDATE ON ledger_entries "
    "BEGIN SELECT RAISE(ABORT, 'ledger_entries is append-only'); END",
    "CREATE TRIGGER ledger_entries_no_delete BEFORE DELETE ON ledger_entries "
    "BEGIN SELECT RAISE(ABORT, 'ledger_entries is append-only'); END",
]
_PG_TRIGGERS = [
    "CREATE FUNCTION ledger_entries_append_only() RETURNS trigger AS $$ "
    "BEGIN RAISE EXCEPTION 'ledger_entries is append-only'; END; $$ LANGUAGE plpgsql",
    "CREATE TRIGGER ledger_entries_no_change BEFORE UPDATE OR DELETE ON ledger_entries "
    "FOR EACH ROW EXECUTE FUNCTION ledger_entries_append_only()",
]


def _ts(name: str, nullable: bool = False) -> sa.Column:
    return sa.Column(name, sa.DateTime(), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "projects",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(64), nullable=False),
        _ts("created_at"),
        sa.PrimaryKeyConstraint("id", name="pk_projects"),
        sa.UniqueConstraint("name", name="uq_projects_name"),
    )
    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("project_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("prefix", sa.String(96), nullable=False),
        sa.Column("hashed_secret", sa.String(64), nullable=False),
        _ts("created_at"),
        _ts("revoked_at", nullable=True),
        sa.Column("rpm_limit", sa.Integer(), nullable=True),
        sa.Column("tpm_limit", sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_api_keys"),
        sa.ForeignKeyConstraint(["project_id"], ["projects.id"], name="fk_api_keys_project_id_projects"),
        sa.UniqueConstraint("hashed_secret", name="uq_api_keys_hashed_secret"),
    )
    op.create_index("ix_api_keys_project_id", "api_keys", ["project_id"])
    op.create_index("ix_api_keys_prefix", "api_keys", ["prefix"])

    op.create_table(
        "price_sheets",
        sa.Column("version", sa.String(64), nullable=False),
        sa.Column("body_json", sa.Text(), nullable=False),
        _ts("effective_from"),
        sa.PrimaryKeyConstraint("version", name="pk_price_sheets"),
    )

    op.create_table(
        "ledger_entries",
        sa.Column("id", sa.Integer(), nullable=False),
        _ts("ts"),
        sa.Column("request_id", sa.String(128), nullable=False),
        sa.Column("idempotency_key", sa.String(128), nullable=True),
        sa.Column("api_key_id", sa.String(32), nullable=True),
        sa.Column("project_id", sa.Integer(), nullable=True),
        sa.Column("model", sa.String(128), nullable=False),
        sa.Column("tier", sa.String(16), nullable=False),
        sa.Column("endpoint", sa.String(64), nullable=False),
        sa.Column("stream", sa.Boolean(), nullable=False),
        sa.Column("batch_id", sa.String(64), nullable=True),
        sa.Column("custom_id", sa.String(128), nullable=True),
        *[sa.Column(f"tokens_{n}", sa.BigInteger(), nullable=False)
          for n in ("input_uncached", "cache_read", "cache_write", "output", "reasoning")],
        *[sa.Column(f"cost_{n}_u", sa.BigInteger(), nullable=False)
          for n in ("input", "cache_read", "cache_write", "output", "total")],
        sa.Column("price_sheet_version", sa.String(64), nullable=False),
        sa.Column("status", sa.String(24), nullable=False),
        sa.Column("finish_reason", sa.String(32), nullable=True),
        sa.Column("reverses_entry_id", sa.Integer(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_ledger_entries"),
        sa.UniqueConstraint("request_id", name="uq_ledger_entries_request_id"),
        sa.UniqueConstraint("reverses_entry_id", name="uq_ledger_entries_reverses_entry_id"),
        sa.ForeignKeyConstraint(["api_key_id"], ["api_keys.id"], name="fk_ledger_entries_api_key_id_api_keys"),
        sa.ForeignKeyConstraint(["project_id"], ["projects.id"], name="fk_ledger_entries_project_id_projects"),
        sa.ForeignKeyConstraint(["reverses_entry_id"], ["ledger_entries.id"],
                                name="fk_ledger_entries_reverses_entry_id_ledger_entries"),
    )
    for col in ("ts", "api_key_id", "project_id", "batch_id"):
        op.create_index(f"ix_ledger_entries_{col}", "ledger_entries", [col])

    op.create_table(
        "budgets",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("scope", sa.String(16), nullable=False),
        sa.Column("scope_id", sa.String(64), nullable=False),
        sa.Column("period", sa.String(16), nullable=False),
        sa.Column("hard_limit_u", sa.BigInteger(), nullable=False),
        sa.Column("soft_limit_u", sa.BigInteger(), nullable=True),
        _ts("created_at"),
        sa.PrimaryKeyConstraint("id", name="pk_budgets"),
        sa.UniqueConstraint("scope", "scope_id", "period", name="uq_budgets_scope_period"),
    )
    op.create_table(
        "reservations",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("request_id", sa.String(128), nullable=False),
        sa.Column("budget_id", sa.Integer(), nullable=False),
        sa.Column("reserved_u", sa.BigInteger(), nullable=False),
        sa.Column("settled", sa.Boolean(), nullable=False),
        sa.Column("settled_u", sa.BigInteger(), nullable=True),
        _ts("created_at"),
        _ts("expires_at"),
        sa.PrimaryKeyConstraint("id", name="pk_reservations"),
        sa.ForeignKeyConstraint(["budget_id"], ["budgets.id"], name="fk_reservations_budget_id_budgets"),
        sa.UniqueConstraint("request_id", "budget_id", name="uq_reservations_request_budget"),
    )
    op.create_index("ix_reservations_request_id", "reservations", ["request_id"])
    op.create_index("ix_reservations_open", "reservations", ["budget_id", "settled", "expires_at"])

    op.create_table(
        "files",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("purpose", sa.String(32), nullable=False),
        sa.Column("filename", sa.String(255), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=True),
        sa.Column("path", sa.String(512), nullable=False),
        sa.Column("api_key_id", sa.String(32), nullable=True),
        _ts("created_at"),
        sa.PrimaryKeyConstraint("id", name="pk_files"),
        sa.ForeignKeyConstraint(["api_key_id"], ["api_keys.id"], name="fk_files_api_key_id_api_keys"),
    )
    op.create_index("ix_files_api_key_id", "files", ["api_key_id"])

    op.create_table(
        "batches",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("input_file_id", sa.String(64), nullable=False),
        sa.Column("endpoint", sa.String(64), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("completion_window", sa.String(16), nullable=False),
        sa.Column("metadata_json", sa.Text(), nullable=True),
        sa.Column("errors_json", sa.Text(), nullable=True),
        sa.Column("output_file_id", sa.String(64), nullable=True),
        sa.Column("error_file_id", sa.String(64), nullable=True),
        sa.Column("request_counts_total", sa.Integer(), nullable=False),
        sa.Column("request_counts_completed", sa.Integer(), nullable=False),
        sa.Column("request_counts_failed", sa.Integer(), nullable=False),
        sa.Column("api_key_id", sa.String(32), nullable=True),
        _ts("created_at"),
        *[_ts(f"{n}_at", nullable=True) for n in
          ("expires", "in_progress", "finalizing", "completed", "failed", "expired", "cancelling", "cancelled")],
        sa.PrimaryKeyConstraint("id", name="pk_batches"),
        sa.ForeignKeyConstraint(["input_file_id"], ["files.id"], name="fk_batches_input_file_id_files"),
        sa.ForeignKeyConstraint(["output_file_id"], ["files.id"], name="fk_batches_output_file_id_files"),
        sa.ForeignKeyConstraint(["error_file_id"], ["files.id"], name="fk_batches_error_file_id_files"),
        sa.ForeignKeyConstraint(["api_key_id"], ["api_keys.id"], name="fk_batches_api_key_id_api_keys"),
    )
    op.create_index("ix_batches_status", "batches", ["status"])
    op.create_index("ix_batches_api_key_id", "batches", ["api_key_id"])

    dialect = op.get_bind().dialect.name
    for stmt in _SQLITE_TRIGGERS if dialect == "sqlite" else _PG_TRIGGERS if dialect == "postgresql" else []:
        op.execute(stmt)


def downgrade() -> None:
    dialect = op.get_bind().dialect.name
    if dialect == "sqlite":
        op.execute("DROP TRIGGER IF EXISTS ledger_entries_no_update")
        op.execute("DROP TRIGGER IF EXISTS ledger_entries_no_delete")
    elif dialect == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS ledger_entries_no_change ON ledger_entries")
        op.execute("DROP FUNCTION IF EXISTS ledger_entries_append_only()")
    for table in ("batches", "files", "reservations", "budgets", "ledger_entries", "price_sheets", "api_keys",
                  "projects"):
        op.drop_table(table)

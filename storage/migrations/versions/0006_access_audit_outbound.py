"""who may do what: the audit log (append-only), who asked for events and runs, the hosts
targets may point at, sign-in lockouts, the engine spec as last started, who acknowledged an alert

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30 12:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

# The audit log is append-only in the database itself, not only in the code that writes it.
_SQLITE_GUARDS = [
    f"""CREATE TRIGGER audit_log_no_{verb.lower()} BEFORE {verb} ON audit_log
    BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END"""
    for verb in ("UPDATE", "DELETE")
]
_PG_GUARD = """
CREATE FUNCTION audit_log_append_only() RETURNS trigger AS $$
BEGIN RAISE EXCEPTION 'the audit log is append-only'; END $$ LANGUAGE plpgsql;
CREATE TRIGGER audit_log_append_only BEFORE UPDATE OR DELETE ON audit_log
FOR EACH ROW EXECUTE FUNCTION audit_log_append_only();
"""


def upgrade() -> None:
    op.create_table(
        "audit_log",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("ts", sa.Float(), nullable=False),
        sa.Column("actor", sa.String(length=200), nullable=False),
        sa.Column("role", sa.String(length=20), nullable=False),
        sa.Column("origin", sa.String(length=20), nullable=False),
        sa.Column("action", sa.String(length=60), nullable=False),
        sa.Column("subject", sa.Text(), nullable=True),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("outcome", sa.String(length=10), nullable=False),
        sa.Column("message", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_audit_log_ts", "audit_log", ["ts"])
    dialect = op.get_bind().dialect.name
    if dialect == "sqlite":
        for statement in _SQLITE_GUARDS:
            op.execute(statement)
    elif dialect == "postgresql":
        op.execute(_PG_GUARD)
    with op.batch_alter_table("events") as batch:
        batch.add_column(sa.Column("actor", sa.String(length=200), nullable=True))
    with op.batch_alter_table("probe_runs") as batch:
        batch.add_column(sa.Column("requested_by", sa.String(length=200), nullable=True))
    with op.batch_alter_table("engine_specs") as batch:
        batch.add_column(sa.Column("started_spec", sa.JSON(), nullable=True))
    with op.batch_alter_table("alerts") as batch:
        batch.add_column(sa.Column("acknowledged_by", sa.String(length=200), nullable=True))
        batch.add_column(sa.Column("acknowledged_at", sa.Float(), nullable=True))
    op.create_table(
        "allowed_hosts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("pattern", sa.String(length=255), nullable=False),
        sa.Column("note", sa.Text(), nullable=True),
        sa.Column("added_by", sa.String(length=200), nullable=True),
        sa.Column("added_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("pattern"),
    )
    op.create_table(
        "signin_failures",
        sa.Column("username", sa.String(length=200), nullable=False),
        sa.Column("failures", sa.Integer(), nullable=False),
        sa.Column("first_at", sa.Float(), nullable=False),
        sa.Column("locked_until", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("username"),
    )


def downgrade() -> None:
    op.drop_table("signin_failures")
    op.drop_table("allowed_hosts")
    with op.batch_alter_table("alerts") as batch:
        batch.drop_column("acknowledged_at")
        batch.drop_column("acknowledged_by")
    with op.batch_alter_table("engine_specs") as batch:
        batch.drop_column("started_spec")
    with op.batch_alter_table("probe_runs") as batch:
        batch.drop_column("requested_by")
    with op.batch_alter_table("events") as batch:
        batch.drop_column("actor")
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP FUNCTION IF EXISTS audit_log_append_only() CASCADE")
    op.drop_index("ix_audit_log_ts", table_name="audit_log")
    op.drop_table("audit_log")

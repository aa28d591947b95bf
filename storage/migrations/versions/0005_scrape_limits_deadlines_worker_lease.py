"""per-target scrape settings, work deadlines, the worker lease, time-weighted rollups

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30 10:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("targets") as batch:
        batch.add_column(sa.Column("scrape", sa.JSON(), nullable=False, server_default="{}"))
    with op.batch_alter_table("probe_runs") as batch:
        batch.add_column(sa.Column("deadline_at", sa.Float(), nullable=True))
    with op.batch_alter_table("rollups") as batch:
        batch.add_column(sa.Column("covered_s", sa.Float(), nullable=True))
        batch.add_column(sa.Column("increase", sa.Float(), nullable=True))
    op.create_table(
        "worker_leases",
        sa.Column("name", sa.String(length=50), nullable=False),
        sa.Column("holder", sa.String(length=64), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("host", sa.String(length=255), nullable=False),
        sa.Column("acquired_at", sa.Float(), nullable=False),
        sa.Column("renewed_at", sa.Float(), nullable=False),
        sa.Column("expires_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )


def downgrade() -> None:
    op.drop_table("worker_leases")
    with op.batch_alter_table("rollups") as batch:
        batch.drop_column("increase")
        batch.drop_column("covered_s")
    with op.batch_alter_table("probe_runs") as batch:
        batch.drop_column("deadline_at")
    with op.batch_alter_table("targets") as batch:
        batch.drop_column("scrape")

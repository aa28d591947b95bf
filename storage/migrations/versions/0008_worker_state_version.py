"""worker state facts count their writes, so a compare-and-set does not rest on a clock

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-07 13:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("worker_state") as batch:
        batch.add_column(sa.Column("version", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("worker_state") as batch:
        batch.drop_column("version")

"""several workers on one store: which worker scrapes which target; targets read from a
Prometheus server instead of scraped

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01 02:40:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "scrape_claims",
        sa.Column(
            "target_id",
            sa.Integer(),
            sa.ForeignKey("targets.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("holder", sa.String(64), nullable=False),
        sa.Column("until", sa.Float(), nullable=False),
    )
    with op.batch_alter_table("targets") as batch:
        batch.add_column(
            sa.Column("source", sa.String(20), nullable=False, server_default="scrape")
        )
        batch.add_column(sa.Column("selector", sa.String(500), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("targets") as batch:
        batch.drop_column("selector")
        batch.drop_column("source")
    op.drop_table("scrape_claims")

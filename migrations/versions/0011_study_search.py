"""study search: the sampler of a study that searches (random or tpe); null for a grid

A search's trials are the study's cells, asked for as its jobs end; the reaper finds the
searches that still have trials to ask for by this column.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02 16:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("study", sa.Column("search", sa.String(16), nullable=True))


def downgrade() -> None:
    op.drop_column("study", "search")

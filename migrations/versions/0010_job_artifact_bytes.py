"""job artifact bytes: what a job's files take as stored, for the owners' artifact budget

Written by the worker after each checkpoint and when the job ends (`core.usage`); null
until measured (rows made before this revision are measured when their usage is read).

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02 03:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("job", sa.Column("artifact_bytes", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    op.drop_column("job", "artifact_bytes")

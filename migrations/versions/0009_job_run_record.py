"""job run record: the digest of the data a job read (indexed), its provenance, its environment

Written by the worker once the job's data is loaded, so running and failed jobs have them
too: `data_digest` ("sha256:<64 hex>") is what the job list's `data_digest=` filter reads,
`data` the provenance record (source, classes, split sizes, skipped files) and
`environment` the versions and device (`training.environment`).

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01 23:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("job", sa.Column("data_digest", sa.String(length=80), nullable=True))
    op.add_column("job", sa.Column("data", sa.JSON(), nullable=True))
    op.add_column("job", sa.Column("environment", sa.JSON(), nullable=True))
    op.create_index("ix_job_data_digest", "job", ["data_digest"])


def downgrade() -> None:
    op.drop_index("ix_job_data_digest", table_name="job")
    op.drop_column("job", "environment")
    op.drop_column("job", "data")
    op.drop_column("job", "data_digest")

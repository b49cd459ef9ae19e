"""worker: the workers register themselves (devices, queues, current job, heartbeat)

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30 22:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "worker",
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("host", sa.String(length=200), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("devices", sa.JSON(), nullable=False),
        sa.Column("queues", sa.JSON(), nullable=False),
        sa.Column("current_job_id", sa.Uuid(), nullable=True),
        sa.Column("jobs_done", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_seen_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["current_job_id"],
            ["job.id"],
            name=op.f("fk_worker_current_job_id_job"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_worker")),
    )
    op.create_index("ix_worker_last_seen_at", "worker", ["last_seen_at"])


def downgrade() -> None:
    op.drop_index("ix_worker_last_seen_at", table_name="worker")
    op.drop_table("worker")

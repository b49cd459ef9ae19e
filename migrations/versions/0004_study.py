"""study: grids of train jobs; a job knows its study, its cell and whether it is held

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30 16:20:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "study",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=True),
        sa.Column("tags", sa.JSON(), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("preset", sa.String(length=64), nullable=True),
        sa.Column("cells", sa.JSON(), nullable=False),
        sa.Column("metric", sa.String(length=32), nullable=False),
        sa.Column("max_parallel", sa.Integer(), nullable=False),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False),
        sa.Column("idempotency_key", sa.String(length=200), nullable=True),
        sa.Column("owner_key_id", sa.Uuid(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["owner_key_id"],
            ["api_key.id"],
            name=op.f("fk_study_owner_key_id_api_key"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_study")),
        sa.UniqueConstraint("idempotency_key", name=op.f("uq_study_idempotency_key")),
    )
    with op.batch_alter_table("job") as batch:
        batch.add_column(sa.Column("study_id", sa.Uuid(), nullable=True))
        batch.add_column(sa.Column("cell", sa.Integer(), nullable=True))
        batch.add_column(
            sa.Column("held", sa.Boolean(), nullable=False, server_default=sa.false())
        )
        batch.create_foreign_key(
            op.f("fk_job_study_id_study"), "study", ["study_id"], ["id"], ondelete="CASCADE"
        )
        batch.create_index("ix_job_study_id_cell", ["study_id", "cell"])


def downgrade() -> None:
    with op.batch_alter_table("job") as batch:
        batch.drop_index("ix_job_study_id_cell")
        batch.drop_constraint(op.f("fk_job_study_id_study"), type_="foreignkey")
        batch.drop_column("held")
        batch.drop_column("cell")
        batch.drop_column("study_id")
    op.drop_table("study")

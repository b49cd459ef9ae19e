"""note and export: a job's editable free-text note; a registered version's exports

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01 01:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("job", sa.Column("note", sa.Text(), nullable=True))
    op.create_table(
        "model_export",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("version_id", sa.Integer(), nullable=False),
        sa.Column("format", sa.String(length=16), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("max_abs_diff", sa.Double(), nullable=False),
        sa.Column("tolerance", sa.Double(), nullable=False),
        sa.Column("details", sa.JSON(), nullable=False),
        sa.Column("owner_key_id", sa.Uuid(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["version_id"],
            ["model_version.id"],
            name=op.f("fk_model_export_version_id_model_version"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["owner_key_id"],
            ["api_key.id"],
            name=op.f("fk_model_export_owner_key_id_api_key"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_model_export")),
        sa.UniqueConstraint("version_id", "format", name=op.f("uq_model_export_version_id_format")),
    )


def downgrade() -> None:
    op.drop_table("model_export")
    op.drop_column("job", "note")

"""alias rollout: a weighted alias's versions, a sticky flag and a shadow; registry history

An alias keeps `version_id` (its primary, the version of greatest weight); a weighted one
has a `model_alias_weight` row per version. Every registry change is a `model_history` row.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-03 12:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("model_alias") as batch:
        batch.add_column(
            sa.Column("sticky", sa.Boolean(), nullable=False, server_default=sa.false())
        )
        batch.add_column(sa.Column("shadow_version_id", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("shadow_percent", sa.Integer(), nullable=True))
        batch.create_foreign_key(
            op.f("fk_model_alias_shadow_version_id_model_version"),
            "model_version",
            ["shadow_version_id"],
            ["id"],
            ondelete="RESTRICT",
        )
    with op.batch_alter_table("model_alias") as batch:
        batch.alter_column("sticky", server_default=None)
    op.create_table(
        "model_alias_weight",
        sa.Column("model_id", sa.Integer(), nullable=False),
        sa.Column("alias", sa.String(length=64), nullable=False),
        sa.Column("version_id", sa.Integer(), nullable=False),
        sa.Column("weight", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["model_id", "alias"],
            ["model_alias.model_id", "model_alias.alias"],
            name=op.f("fk_model_alias_weight_model_id_model_alias"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["version_id"],
            ["model_version.id"],
            name=op.f("fk_model_alias_weight_version_id_model_version"),
            ondelete="RESTRICT",
        ),
        sa.PrimaryKeyConstraint(
            "model_id", "alias", "version_id", name=op.f("pk_model_alias_weight")
        ),
    )
    op.create_table(
        "model_history",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("model_id", sa.Integer(), nullable=False),
        sa.Column("action", sa.String(length=32), nullable=False),
        sa.Column("alias", sa.String(length=64), nullable=True),
        sa.Column("version", sa.Integer(), nullable=True),
        sa.Column("before", sa.JSON(), nullable=True),
        sa.Column("after", sa.JSON(), nullable=True),
        sa.Column("key_id", sa.Uuid(), nullable=True),
        sa.Column("key_name", sa.String(length=100), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["model_id"],
            ["registered_model.id"],
            name=op.f("fk_model_history_model_id_registered_model"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["key_id"],
            ["api_key.id"],
            name=op.f("fk_model_history_key_id_api_key"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_model_history")),
    )
    op.create_index(op.f("ix_model_history_model_id"), "model_history", ["model_id"])


def downgrade() -> None:
    op.drop_index(op.f("ix_model_history_model_id"), table_name="model_history")
    op.drop_table("model_history")
    op.drop_table("model_alias_weight")
    with op.batch_alter_table("model_alias") as batch:
        batch.drop_constraint(
            op.f("fk_model_alias_shadow_version_id_model_version"), type_="foreignkey"
        )
        batch.drop_column("shadow_percent")
        batch.drop_column("shadow_version_id")
        batch.drop_column("sticky")

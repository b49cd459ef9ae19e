"""owner: registered models, their versions and dataset uploads record the API key that
made them; an Idempotency-Key is unique per owner

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30 19:10:00

Rows made before this revision keep no owner (NULL): only admin keys change them.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

IDEMPOTENT = ("job", "study")  # the tables that keep an Idempotency-Key


def upgrade() -> None:
    for table in IDEMPOTENT:
        with op.batch_alter_table(table) as batch:
            batch.drop_constraint(op.f(f"uq_{table}_idempotency_key"), type_="unique")
            batch.create_unique_constraint(
                op.f(f"uq_{table}_owner_key_id_idempotency_key"),
                ["owner_key_id", "idempotency_key"],
            )
        # NULL owners differ from each other in a unique constraint: rows made with auth
        # off need one of their own.
        anonymous = sa.text("owner_key_id IS NULL")
        op.create_index(
            f"uq_{table}_idempotency_key_anonymous",
            table,
            ["idempotency_key"],
            unique=True,
            postgresql_where=anonymous,
            sqlite_where=anonymous,
        )
    for table in ("registered_model", "model_version"):
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("owner_key_id", sa.Uuid(), nullable=True))
            batch.create_foreign_key(
                op.f(f"fk_{table}_owner_key_id_api_key"),
                "api_key",
                ["owner_key_id"],
                ["id"],
                ondelete="SET NULL",
            )
    op.create_table(
        "upload",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("owner_key_id", sa.Uuid(), nullable=True),
        sa.Column("files", sa.Integer(), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["owner_key_id"],
            ["api_key.id"],
            name=op.f("fk_upload_owner_key_id_api_key"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_upload")),
        sa.UniqueConstraint("sha256", "owner_key_id", name=op.f("uq_upload_sha256_owner_key_id")),
    )
    op.create_index("ix_upload_owner_key_id", "upload", ["owner_key_id"])


def downgrade() -> None:
    op.drop_index("ix_upload_owner_key_id", table_name="upload")
    op.drop_table("upload")
    for table in ("model_version", "registered_model"):
        with op.batch_alter_table(table) as batch:
            batch.drop_constraint(op.f(f"fk_{table}_owner_key_id_api_key"), type_="foreignkey")
            batch.drop_column("owner_key_id")
    for table in IDEMPOTENT:
        # One key is unique again across owners: it stays on its earliest row.
        op.execute(
            f"UPDATE {table} SET idempotency_key = NULL WHERE EXISTS (SELECT 1 FROM {table} "
            f"AS earlier WHERE earlier.idempotency_key = {table}.idempotency_key AND "
            f"(earlier.created_at < {table}.created_at OR (earlier.created_at = "
            f"{table}.created_at AND earlier.id < {table}.id)))"
        )
        op.drop_index(f"uq_{table}_idempotency_key_anonymous", table_name=table)
        with op.batch_alter_table(table) as batch:
            batch.drop_constraint(op.f(f"uq_{table}_owner_key_id_idempotency_key"), type_="unique")
            batch.create_unique_constraint(op.f(f"uq_{table}_idempotency_key"), ["idempotency_key"])

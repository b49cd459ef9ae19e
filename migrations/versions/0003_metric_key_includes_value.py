"""metric: the primary key index includes value (index-only reads of sampled curves)

Postgres only; SQLite keeps its plain key. Rebuilding the key locks the metric table
for the time it takes to index it: run it in a quiet moment on a large database.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29 17:00:00
"""

from __future__ import annotations

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def _rebuild_key(include: str) -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(
        "ALTER TABLE metric DROP CONSTRAINT pk_metric, "
        f"ADD CONSTRAINT pk_metric PRIMARY KEY (job_id, name, step){include}"
    )


def upgrade() -> None:
    _rebuild_key(" INCLUDE (value)")


def downgrade() -> None:
    _rebuild_key("")

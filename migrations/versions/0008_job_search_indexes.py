"""job search: GIN indexes of the spec and the tags as jsonb; the summary stored as jsonb

Postgres only. The job list's `path=value` filters on the spec and its tag filter are
jsonb containment (`spec::jsonb @> '{"model": {"options": {"unit": "full_preact"}}}'`):
with these indexes they are index lookups however rare the value, and the planner gets
the expressions' statistics. Expression indexes: the spec stays json (its keys in the
order submitted). The summary becomes jsonb, so that a sort or a filter on one of its keys
reads that key, not the whole text of every summary (an evaluation's holds its confusion
matrix). SQLite has no such index; its filters read every row, which the embedded mode's
sizes allow. The upgrade rewrites the job table once.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01 02:00:00
"""

from __future__ import annotations

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

# core.db.tables.SEARCH_INDEXES names them too (autogenerate cannot compare them).
INDEXES = {"ix_job_spec_jsonb": "spec", "ix_job_tags_jsonb": "tags"}


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("ALTER TABLE job ALTER COLUMN summary TYPE jsonb USING summary::jsonb")
    for name, column in INDEXES.items():
        op.execute(f"CREATE INDEX {name} ON job USING gin (({column}::jsonb) jsonb_path_ops)")


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for name in INDEXES:
        op.execute(f"DROP INDEX {name}")
    op.execute("ALTER TABLE job ALTER COLUMN summary TYPE json USING summary::json")

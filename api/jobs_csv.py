"""The job list as CSV: every job that passes the filters, read and sent a page at a time.

Text cells that a spreadsheet would run as formulas (a name `=HYPERLINK(...)`) are quoted
(`training.spreadsheets`); numbers are written as they are.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any

from api import queries, search
from core import kinds
from core.db.session import session_scope
from core.db.tables import Job
from training.spreadsheets import text_cell

COLUMNS = (
    *("id", "name", "kind", "status", "model", "dataset", "tags", "note"),
    *("created_at", "finished_at", "final_test_error", "best_test_error"),
    *("params", "macs", "wall_time_s", "images_per_s"),
)
_ATTRIBUTES = {"model": "model_name", "dataset": "dataset_name"}
PAGE = 500  # rows a database read; each is its own short transaction


def header(extra: Sequence[search.Field]) -> list[str]:
    """The column names: the fixed ones, then the extra paths as asked."""
    return [*COLUMNS, *(field.name for field in extra)]


def stream(
    url: str, filters: queries.JobFilter, sort: str, extra: Sequence[search.Field]
) -> Iterator[bytes]:
    """The header line, then the matching jobs' lines, in `sort` order."""
    yield _line(header(extra))
    cursor: str | None = None
    while True:
        with session_scope(url) as session:
            jobs, cursor = queries.list_jobs(
                session=session,
                filters=filters,
                sort=sort,
                limit=PAGE,
                cursor=cursor,
                documents=any(field.document == "summary" for field in extra),
            )
            lines = [_line(row(job, extra)) for job in jobs]
        yield b"".join(lines)
        if cursor is None:
            return


def row(job: Job, extra: Sequence[search.Field]) -> list[str]:
    """One job's cells: tags joined by `;`, times in ISO form, missing values empty."""
    values: list[Any] = [getattr(job, _ATTRIBUTES.get(name, name)) for name in COLUMNS]
    values[COLUMNS.index("tags")] = ";".join(job.tags)
    values += [_read(field, job) for field in extra]
    return [_cell(value) for value in values]


def _read(field: search.Field, job: Job) -> Any:
    """A field's value as clients read it: a server path in the spec or summary is left out."""
    value = field.read(job)
    if field.column is not None:
        return value
    return kinds.shown(job.kind, field.document or "spec", value, field.path)


def _cell(value: Any) -> str:
    """A value as a cell: text that a spreadsheet would run as a formula is quoted."""
    if isinstance(value, str):
        return text_cell(value)
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, dict | list):
        return json.dumps(value)
    return str(value)


def _line(cells: list[str]) -> bytes:
    out = io.StringIO()
    csv.writer(out).writerow(cells)
    return out.getvalue().encode()

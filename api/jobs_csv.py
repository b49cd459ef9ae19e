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

from client.filters import JobFilter
from core import job_queries, job_search, kinds
from core.db.session import session_scope
from core.db.tables import Job
from core.owners import Caller
from training.spreadsheets import text_cell

COLUMNS = (
    *("id", "name", "kind", "status", "model", "dataset", "tags", "note"),
    *("created_at", "finished_at", "final_test_error", "best_test_error"),
    *("params", "macs", "wall_time_s", "images_per_s"),
)
_ATTRIBUTES = {"model": "model_name", "dataset": "dataset_name"}
PAGE = 500  # rows a database read; each is its own short transaction


def header(extra: Sequence[job_search.Field]) -> list[str]:
    """The column names: the fixed ones, then the extra paths as asked."""
    return [*COLUMNS, *(field.name for field in extra)]


def stream(
    url: str, filters: JobFilter, caller: Caller, extra: Sequence[job_search.Field]
) -> Iterator[bytes]:
    """The header line, then the lines of the jobs the caller may read that pass `filters`,
    in their `sort` order. The first page is read now: a refusal (another's jobs, a cursor)
    comes before the answer starts."""
    first = _page(url, filters, caller, extra, None)
    return _lines(url, filters, caller, extra, first)


def _lines(
    url: str,
    filters: JobFilter,
    caller: Caller,
    extra: Sequence[job_search.Field],
    first: tuple[bytes, str | None],
) -> Iterator[bytes]:
    yield _line(header(extra))
    lines, cursor = first
    yield lines
    while cursor is not None:
        lines, cursor = _page(url, filters, caller, extra, cursor)
        yield lines


def _page(
    url: str,
    filters: JobFilter,
    caller: Caller,
    extra: Sequence[job_search.Field],
    cursor: str | None,
) -> tuple[bytes, str | None]:
    """A page of lines, read in a short transaction of its own, and the next page's cursor."""
    with session_scope(url) as session:
        jobs, cursor = job_queries.list_jobs(
            session=session,
            filters=filters,
            caller=caller,
            limit=PAGE,
            cursor=cursor,
            documents=any(field.document == "summary" for field in extra),
        )
        return b"".join(_line(row(job, extra)) for job in jobs), cursor


def row(job: Job, extra: Sequence[job_search.Field]) -> list[str]:
    """One job's cells: tags joined by `;`, times in ISO form, missing values empty."""
    values: list[Any] = [getattr(job, _ATTRIBUTES.get(name, name)) for name in COLUMNS]
    values[COLUMNS.index("tags")] = ";".join(job.tags)
    values += [_read(field, job) for field in extra]
    return [_cell(value) for value in values]


def _read(field: job_search.Field, job: Job) -> Any:
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

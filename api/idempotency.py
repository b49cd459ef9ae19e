"""Idempotency-Key: a submission sent twice makes one row, and the second answer is the first.

A key belongs to its owner (the API key that sent it; none with auth off): the same
Idempotency-Key from two API keys makes two rows. Jobs and studies keep it unique per
owner. Concurrent submissions of one key take turns (a transaction lock on the key:
Postgres's advisory lock, SQLite's lock file), so the later ones find the first's row; a
duplicate that still meets the unique index at commit answers with the row that won.
"""

from __future__ import annotations

import uuid
from typing import TypeVar

from fastapi import Response, status
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from core.db.session import take_turns
from core.db.tables import Job, Study
from core.errors import ConflictError

Row = TypeVar("Row", Job, Study)


def earlier(
    session: Session, table: type[Row], key: str | None, owner: uuid.UUID | None
) -> Row | None:
    """The row an earlier submission of `owner` with `key` made, if any."""
    if key is None:
        return None
    # A concurrent request with the key waits until this one commits, then sees its row
    # (an INSERT of the same key would block at the unique index and fail instead).
    take_turns(session, f"{table.__tablename__} {owner} {key}")
    mine = table.owner_key_id.is_not_distinct_from(owner)
    return session.scalars(select(table).where(table.idempotency_key == key, mine)).one_or_none()


def commit_or_earlier(
    session: Session, table: type[Row], key: str | None, owner: uuid.UUID | None
) -> Row | None:
    """Commit the new row; None, or the earlier row when a concurrent duplicate won."""
    try:
        session.commit()
    except IntegrityError:  # the same key of the same owner, sent concurrently, won the race
        session.rollback()
        found = earlier(session, table, key, owner)
        if found is None:
            raise
        return found
    return None


def replay(row: Job | Study, *, same: bool, what: str, response: Response) -> None:
    """Answer with the earlier row (200) if the request was the same; else 409."""
    if not same:
        raise ConflictError(
            f"Idempotency-Key {row.idempotency_key!r} was used for {what} {row.id} with a "
            f"different {'spec' if what == 'job' else 'request'}; use a new key"
        )
    response.status_code = status.HTTP_200_OK

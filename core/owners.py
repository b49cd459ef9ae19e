"""Owners: the API key that made a job, study, upload or registered model, and what a
caller may read and change of the rows others made.

A `train` key changes (cancels, deletes, re-aliases) only what it owns; an `admin` key
changes everything. Every `read` key reads everything unless reads keep to their owner
(`READS_OWNER_ONLY`): then another's row is not found (404, so its existence does not
leak) and lists show only the caller's. Rows made with auth off (or before owners were
recorded) have no owner: only admin keys change them. With auth off there is no key,
and everything is allowed.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from sqlalchemy import ColumnElement
from sqlalchemy.orm import InstrumentedAttribute, Session

from core.db.tables import Job, Study
from core.errors import InvalidError, NotFoundError, NotOwnedError
from core.keys import Principal

Row = TypeVar("Row", Job, Study)
Owner = uuid.UUID | Literal["me"] | None  # the owner a list is asked for (`me`: the caller)


@dataclass(frozen=True)
class Caller:
    """Who asks: an API key (None when auth is off) and whether its reads keep to its own."""

    key: Principal | None = None
    own_reads_only: bool = False

    @property
    def owner(self) -> uuid.UUID | None:
        """The owner of the rows this caller makes."""
        return self.key.key_id if self.key is not None else None

    @property
    def reads_of(self) -> uuid.UUID | None:
        """The only owner whose rows this caller may read; None: every owner's."""
        if self.key is None or not self.own_reads_only or self.key.allows("admin"):
            return None
        return self.key.key_id

    def sees(self, owner: uuid.UUID | None) -> bool:
        """Whether a row of `owner` exists for this caller."""
        reads_of = self.reads_of
        return reads_of is None or owner == reads_of

    def may_change(self, owner: uuid.UUID | None) -> bool:
        """Whether this caller may change a row of `owner`."""
        return self.key is None or self.key.allows("admin") or owner == self.key.key_id


ANYONE = Caller()  # auth off, or the service itself: reads and changes everything


def visible(
    caller: Caller,
    owner: ColumnElement[Any] | InstrumentedAttribute[Any],
    asked: Owner = None,
    *,
    noun: str = "rows",
) -> list[ColumnElement[bool]]:
    """The WHERE clauses that keep a list's rows (`owner`: their owner column) to those the
    caller may read and, when asked, to one owner's (`me`: the caller's); `NotOwnedError`
    for another's when reads keep to their owner."""
    kept = _kept_to(caller, asked, noun)
    return [] if kept is None else [owner == kept]


def _kept_to(caller: Caller, asked: Owner, noun: str) -> uuid.UUID | None:
    """The one owner a list keeps to; None: any."""
    if asked == "me":
        if caller.owner is None:
            raise InvalidError("owner=me needs an API key; auth is off", field=("query", "owner"))
        asked = caller.owner
    reads_of = caller.reads_of
    if reads_of is not None and asked is not None and asked != reads_of:
        raise NotOwnedError(
            f"this API key reads only its own {noun} (READS_OWNER_ONLY); ask for owner=me or "
            "leave owner out"
        )
    return reads_of if asked is None else asked


def check_visible(caller: Caller, owner: uuid.UUID | None, missing: str) -> None:
    """Raise `NotFoundError(missing)` when the caller may not read a row of `owner`."""
    if not caller.sees(owner):
        raise NotFoundError(missing)


def check_owner(caller: Caller, owner: uuid.UUID | None, what: str, action: str) -> None:
    """Raise `NotOwnedError` when the caller may not `action` `what`, a row of `owner`."""
    if not caller.may_change(owner):
        raise NotOwnedError(
            f"this API key does not own {what}; only the key that made it or an admin key "
            f"may {action} it"
        )


def fetch(
    session: Session,
    table: type[Row],
    row_id: uuid.UUID,
    caller: Caller,
    *,
    noun: str,
    action: str | None = None,
) -> Row:
    """The row `row_id` of `table` if the caller may read it, else `NotFoundError`; given
    an `action`, locked, and only if the caller may `action` it, else `NotOwnedError`."""
    row = session.get(table, row_id, with_for_update=action is not None)
    missing = f"{noun} {row_id} does not exist"
    if row is None:
        raise NotFoundError(missing)
    check_visible(caller, row.owner_key_id, missing)
    if action is not None:
        check_owner(caller, row.owner_key_id, f"{noun} {row_id}", action)
    return row

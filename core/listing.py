"""Lists: the rows a caller may see, filtered, in a keyset order, a page at a time.

Every list of the service (jobs, registered models, studies, uploads) is one call of
`page`, as Netflix dispatch's `search_filter_sort_paginate`: the owner filter
(`core.owners.visible`), the list's own conditions, an order of keys whose last is unique,
and an opaque cursor that holds the order's name and the last row's keys, so that the next
page starts after that row whatever was added meanwhile.
"""

from __future__ import annotations

import base64
import binascii
import json
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, Literal, NamedTuple, TypeVar

from sqlalchemy import ColumnElement, Select, and_, or_, tuple_
from sqlalchemy.orm import InstrumentedAttribute, Session

from core.errors import InvalidError
from core.owners import Caller, Owner, visible

T = TypeVar("T")
Read = TypeVar("Read")
KeyKind = Literal["time", "number", "integer", "text", "id"]
Column = ColumnElement[Any] | InstrumentedAttribute[Any]
MAX_INTEGER = 2**31 - 1  # an integer key is a 32-bit column


@dataclass(frozen=True)
class Key:
    """One column of a list's order: what a cursor calls it and how it holds its value."""

    name: str
    column: Column
    kind: KeyKind
    nullable: bool = False  # only the first key may hold nulls; they sort last
    label: str | None = None  # its place in a cursor's shape; default: its name


@dataclass(frozen=True)
class Order:
    """A list's order: its name (the `sort` asked for), its keys, and their direction."""

    name: str
    keys: tuple[Key, ...]  # the last is unique and never null (an id, a unique name)
    descending: bool = False
    noun: str = "row"  # what the rows are, for a refusal: "job"

    def by(self) -> list[ColumnElement[Any]]:
        """The ORDER BY clauses: each key in the direction, nulls last."""
        clauses: list[ColumnElement[Any]] = []
        for key in self.keys:
            clause = key.column.desc() if self.descending else key.column.asc()
            clauses.append(clause.nulls_last() if key.nullable else clause)
        return clauses


def newest(created: Column, row_id: Column, *, noun: str, id_kind: KeyKind = "id") -> Order:
    """The order of a list newest first (`sort=-created`), ties by id."""
    keys = (Key("created_at", created, "time"), Key("id", row_id, id_kind))
    return Order("-created", keys, descending=True, noun=noun)


class Page(NamedTuple, Generic[T]):
    """One page of a list, and the cursor of the next (None at the end)."""

    items: list[T]
    next_cursor: str | None


def page(
    *,
    session: Session,
    query: Select[T],
    order: Order,
    caller: Caller,
    owner: Column,
    asked_owner: Owner = None,
    limit: int | None = None,
    cursor: str | None = None,
) -> Page[T]:
    """The rows of `query` the caller may see (of `asked_owner`, `me` for the caller's),
    after `cursor`, `limit` of them (None: all), in `order`."""
    query = query.where(*visible(caller, owner, asked_owner, noun=f"{order.noun}s"))
    if cursor is not None:
        query = query.where(_after(order, decode_cursor(cursor, order)))
    keyed = query.add_columns(*(key.column for key in order.keys)).order_by(*order.by())
    if limit is not None:
        keyed = keyed.limit(limit + 1)
    rows = session.execute(keyed).all()
    more = limit is not None and len(rows) > limit
    rows = rows[:limit]
    items = [row[0] for row in rows]
    return Page(items, encode_cursor(order, rows[-1][1:]) if more else None)


def _after(order: Order, values: Sequence[Any]) -> ColumnElement[bool]:
    """The rows after a cursor's key values in `order` (the first key's nulls last)."""
    first, *rest = order.keys
    if first.nullable and values[0] is None:  # already among the trailing nulls
        return and_(first.column.is_(None), _beyond(order, rest, values[1:]))
    beyond = _beyond(order, order.keys, values)
    return or_(beyond, first.column.is_(None)) if first.nullable else beyond


def _beyond(order: Order, keys: Sequence[Key], values: Sequence[Any]) -> ColumnElement[bool]:
    """(keys) past (values) in the order's direction."""
    if len(keys) == 1:
        column, value = keys[0].column, values[0]
        beyond: ColumnElement[bool] = column < value if order.descending else column > value
        return beyond
    row, cursor = tuple_(*(key.column for key in keys)), tuple(values)
    return row < cursor if order.descending else row > cursor


def encode_cursor(order: Order, values: Sequence[Any]) -> str:
    """An opaque cursor: the order's name and the key values of a page's last row."""
    shown = [value.isoformat() if isinstance(value, datetime) else value for value in values]
    shown = [str(value) if isinstance(value, uuid.UUID) else value for value in shown]
    raw = json.dumps([order.name, *shown]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str, order: Order) -> list[Any]:
    """The key values of a cursor; `InvalidError` when it is not one of `order`'s."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        parts = json.loads(raw)
    except (binascii.Error, ValueError) as error:
        raise _bad_cursor("it is not base64 of JSON") from error
    if not isinstance(parts, list) or len(parts) != len(order.keys) + 1:
        shape = ", ".join(["sort", *(key.label or key.name for key in order.keys)])
        raise _bad_cursor(f"it is not a [{shape}] list")
    name, *values = parts
    if name != order.name:
        raise InvalidError(
            f"cursor belongs to sort={name}, not sort={order.name}", field=("query", "cursor")
        )
    return [_value(key, value, order.noun) for key, value in zip(order.keys, values, strict=True)]


def _value(key: Key, value: Any, noun: str) -> Any:
    """A key's value in a cursor, as its kind holds it, or `InvalidError` saying why not."""
    if key.kind == "id":
        return _id(value, noun)
    if value is None:
        if not key.nullable:
            raise _bad_cursor(f"its {key.name} value is null")
        return None
    if key.kind == "time":
        return _time(key, value)
    if key.kind == "text":
        if not isinstance(value, str) or "\x00" in value:
            raise _bad_cursor(f"its {key.name} value is not text")
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _bad_cursor(f"its {key.name} value is not a number")
    if key.kind == "integer":
        if not isinstance(value, int):
            raise _bad_cursor(f"its {key.name} value is not an integer")
        if not -MAX_INTEGER <= value <= MAX_INTEGER:
            raise _bad_cursor(f"its {key.name} value is out of range")
        return value
    try:
        return float(value)
    except OverflowError:
        raise _bad_cursor(f"its {key.name} value is out of range") from None


def _id(value: Any, noun: str) -> uuid.UUID:
    """The row id of a cursor: a UUID in its string form."""
    return _read(value, uuid.UUID, f"its id is not a {noun} id")


def _time(key: Key, value: Any) -> datetime:
    """A time key's value: an ISO time."""
    return _read(value, datetime.fromisoformat, f"its {key.name} value is not an ISO time")


def _read(value: Any, parse: Callable[[str], Read], why: str) -> Read:
    """`parse(value)` of a cursor's string, or `InvalidError` saying `why` not."""
    if isinstance(value, str):
        try:
            return parse(value)
        except ValueError:
            pass
    raise _bad_cursor(why)


def _bad_cursor(why: str) -> InvalidError:
    return InvalidError(
        f"cursor is not one this API gave out ({why}); pass a page's next_cursor as it came, "
        "or leave cursor out for the first page",
        field=("query", "cursor"),
    )

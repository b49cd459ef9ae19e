"""The one listing helper called directly, on Postgres and SQLite: what the caller may see,
filtered, in a keyset order, a page at a time, with cursors it gave out and no others."""

from __future__ import annotations

import base64
import json
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import select

from core import keys, listing
from core.db.session import session_scope
from core.db.tables import RegisteredModel, Study
from core.errors import InvalidError, NotOwnedError
from core.owners import ANYONE, Caller

BY_NAME = listing.Order("name", (listing.Key("name", RegisteredModel.name, "text"),), noun="model")
NEWEST = listing.newest(Study.created_at, Study.id, noun="study")
WHEN = datetime(2026, 11, 1, tzinfo=UTC)


@pytest.fixture(scope="module")
def models(database_url: str, reader: keys.Principal) -> list[str]:
    """Seven models under one prefix, the odd ones reader's, in name order."""
    prefix = uuid.uuid4().hex[:8]
    names = [f"{prefix}-{index}" for index in range(7)]
    with session_scope(database_url) as session:
        for index, name in enumerate(reversed(names)):
            owner = reader.key_id if index % 2 else None
            session.add(RegisteredModel(name=name, owner_key_id=owner, created_at=WHEN))
    return names


@pytest.fixture(scope="module")
def studies(database_url: str) -> list[uuid.UUID]:
    """Five studies made at one time (ties by id), newest first."""
    ids = [uuid.uuid4() for _ in range(5)]
    with session_scope(database_url) as session:
        for study_id in ids:
            row = Study(id=study_id, spec={}, cells=[], metric="m", max_parallel=1, created_at=WHEN)
            session.add(row)
    return sorted(ids, reverse=True)


def _pages(url: str, query: Any, order: listing.Order, caller: Caller, **asked: Any) -> list[Any]:
    """Every page's rows, following the cursors, two rows a page."""
    pages, cursor = [], None
    owner = query.selected_columns[0].table.c.owner_key_id
    with session_scope(url) as session:
        while True:
            page = listing.page(
                session=session,
                query=query,
                order=order,
                caller=caller,
                owner=owner,
                limit=2,
                cursor=cursor,
                **asked,
            )
            pages.append(page.items)
            if (cursor := page.next_cursor) is None:
                return pages


def _named(models: list[str]) -> Any:
    return select(RegisteredModel).where(RegisteredModel.name.startswith(models[0][:8]))


def test_pages_cover_every_row_once_in_order(database_url: str, models: list[str]) -> None:
    pages = _pages(database_url, _named(models), BY_NAME, ANYONE)
    assert [len(page) for page in pages] == [2, 2, 2, 1]
    assert [row.name for page in pages for row in page] == models


def test_ties_of_the_first_key_go_by_id(database_url: str, studies: list[uuid.UUID]) -> None:
    query = select(Study).where(Study.id.in_(studies))
    pages = _pages(database_url, query, NEWEST, ANYONE)
    assert [row.id for page in pages for row in page] == studies


def test_the_owner_filter_keeps_to_what_the_caller_may_read(
    database_url: str, models: list[str], reader: keys.Principal
) -> None:
    own = Caller(reader, own_reads_only=True)
    kept = [row.name for page in _pages(database_url, _named(models), BY_NAME, own) for row in page]
    assert kept == models[1::2]
    asked = _pages(database_url, _named(models), BY_NAME, Caller(reader), asked_owner="me")
    assert [row.name for page in asked for row in page] == kept
    with pytest.raises(NotOwnedError, match="reads only its own models"):
        _pages(database_url, _named(models), BY_NAME, own, asked_owner=uuid.uuid4())


def _forged(parts: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps(parts).encode()).decode().rstrip("=")


@pytest.mark.parametrize(
    ("table", "order", "parts", "why"),
    [
        (RegisteredModel, BY_NAME, ["-created", "x"], "belongs to sort=-created, not sort=name"),
        (RegisteredModel, BY_NAME, ["name"], r"not a \[sort, name\] list"),
        (RegisteredModel, BY_NAME, ["name", 5], "its name value is not text"),
        (Study, NEWEST, ["-created", "2026-11-01", "x"], "its id is not a study id"),
        (Study, NEWEST, ["-created", None, str(uuid.uuid4())], "its created_at value is null"),
        (Study, NEWEST, ["-created", "soon", str(uuid.uuid4())], "not an ISO time"),
    ],
)
def test_a_cursor_it_did_not_give_out_is_invalid_saying_why(
    database_url: str, table: Any, order: listing.Order, parts: Any, why: str
) -> None:
    with pytest.raises(InvalidError, match=why) as refused, session_scope(database_url) as s:
        listing.page(
            session=s,
            query=select(table),
            order=order,
            caller=ANYONE,
            owner=table.owner_key_id,
            limit=1,
            cursor=_forged(parts),
        )
    assert refused.value.field == ("query", "cursor")


def test_without_a_limit_every_row_is_one_page(database_url: str, models: list[str]) -> None:
    with session_scope(database_url) as session:
        page = listing.page(
            session=session,
            query=_named(models),
            order=BY_NAME,
            caller=ANYONE,
            owner=RegisteredModel.owner_key_id,
        )
    assert [row.name for row in page.items] == models
    assert page.next_cursor is None

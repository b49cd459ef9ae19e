"""Engines and sessions; Postgres in production, SQLite for the embedded default."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, func, select
from sqlalchemy.engine import make_url
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import NullPool

# The errors of a database that is down, restarting, refusing connections or cutting them
# (no pooled connection free counts too): worth a retry, never a fault of the request.
UNAVAILABLE = (OperationalError, InterfaceError, PoolTimeoutError)

# No transaction of the service sits idle this long; one that does belongs to a process
# frozen mid-write (SIGSTOP, a hung host), and Postgres ends it so that its row locks go
# and other workers can take its job over.
IDLE_IN_TRANSACTION_S = 30


def get_engine(url: str, *, pooled: bool = True) -> Engine:
    """One engine per database URL per process; `pooled=False` keeps no idle connection."""
    return _engine(url, pooled)


@lru_cache(maxsize=8)
def _engine(url: str, pooled: bool) -> Engine:
    parsed = make_url(url)
    pool: dict[str, Any] = {} if pooled else {"poolclass": NullPool}
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        arguments = {"timeout": 30, "check_same_thread": False}
        engine = create_engine(url, connect_args=arguments, **pool)
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    if pooled:
        pool = {"pool_pre_ping": True, "pool_size": 10, "max_overflow": 20}
    timeout = f"-c idle_in_transaction_session_timeout={IDLE_IN_TRANSACTION_S * 1000}"
    return create_engine(url, connect_args={"options": timeout}, **pool)


def _sqlite_pragmas(connection: object, _record: object) -> None:
    # WAL lets the API read while a worker writes; foreign keys are off by default.
    cursor = connection.cursor()  # type: ignore[attr-defined]
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.close()


@lru_cache(maxsize=8)
def _factory(url: str, pooled: bool) -> sessionmaker[Session]:
    return sessionmaker(get_engine(url, pooled=pooled), expire_on_commit=False)


@contextmanager
def session_scope(url: str, *, pooled: bool = True) -> Iterator[Session]:
    """A session whose transaction commits on success and rolls back on error."""
    with _factory(url, pooled)() as session, session.begin():
        yield session


def take_turns(session: Session, name: str) -> None:
    """Hold a lock on `name` to the end of the transaction (Postgres; SQLite writes one at a
    time anyway): a concurrent transaction asking for it waits until this one ends."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(select(func.pg_advisory_xact_lock(func.hashtextextended(name, 0))))

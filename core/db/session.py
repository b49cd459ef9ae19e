"""Engines and sessions; Postgres in production, SQLite for the embedded default."""

from __future__ import annotations

import fcntl
import hashlib
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, func, select
from sqlalchemy.engine import make_url
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from sqlalchemy.orm import Session, SessionTransaction, sessionmaker
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
    """Hold a lock on `name` to the end of the transaction: a concurrent transaction (of any
    thread or process) asking for it waits until this one ends."""
    bind = session.get_bind()
    if bind.dialect.name == "postgresql":
        session.execute(select(func.pg_advisory_xact_lock(func.hashtextextended(name, 0))))
    elif bind.dialect.name == "sqlite":
        _take_sqlite_turn(session, bind.engine.url.database, name)


# SQLite has no advisory lock. Its turns are one of `_SLOTS` byte-range locks of a file beside
# the database (fcntl: between processes) and a threading lock per slot (between the threads
# of one process, which fcntl does not tell apart); two names sharing a slot take turns too.
_SLOTS = 4096


@dataclass(eq=False)
class _Turns:
    """The turn locks of one SQLite database in this process."""

    file: int | None  # descriptor of `<database>.turns`; None for an in-memory database
    threads: list[threading.Lock] = field(
        default_factory=lambda: [threading.Lock() for _ in range(_SLOTS)]
    )


_turns: dict[str, _Turns] = {}
_turns_guard = threading.Lock()


def _turns_of(database: str | None) -> _Turns:
    with _turns_guard:
        key = database or ":memory:"
        if key not in _turns:
            on_disk = key != ":memory:" and not key.startswith("file:")
            file = os.open(f"{key}.turns", os.O_RDWR | os.O_CREAT, 0o600) if on_disk else None
            _turns[key] = _Turns(file)
        return _turns[key]


def _take_sqlite_turn(session: Session, database: str | None, name: str) -> None:
    """Take the slot of `name` for this session's transaction (once, if it holds it)."""
    slot = int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest()) % _SLOTS
    held: list[tuple[_Turns, int]] = session.info.setdefault(_HELD, [])
    turns = _turns_of(database)
    if (turns, slot) in held:
        return
    session.connection()  # the transaction the turn lasts
    turns.threads[slot].acquire()
    try:
        if turns.file is not None:
            fcntl.lockf(turns.file, fcntl.LOCK_EX, 1, slot)
    except BaseException:
        turns.threads[slot].release()
        raise
    held.append((turns, slot))


_HELD = "sqlite_turns"


@event.listens_for(Session, "after_transaction_end")
def _end_sqlite_turns(session: Session, transaction: SessionTransaction) -> None:
    """Release the turns a session took once its outermost transaction ends."""
    if transaction.parent is not None or _HELD not in session.info:
        return
    for turns, slot in session.info.pop(_HELD):
        if turns.file is not None:
            fcntl.lockf(turns.file, fcntl.LOCK_UN, 1, slot)
        turns.threads[slot].release()


def _forget_turns() -> None:
    # A forked child holds none of its parent's locks (threading locks held by another thread
    # of the parent would stay held in it forever): it starts afresh.
    global _turns_guard
    _turns.clear()
    _turns_guard = threading.Lock()


os.register_at_fork(after_in_child=_forget_turns)

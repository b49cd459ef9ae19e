"""Named locks held across the service's processes for longer than a transaction should
last (an export: seconds to minutes, where Postgres ends a transaction idle for 30 s).

On Postgres, session advisory locks on a connection of their own, outside any
transaction; on SQLite (the embedded database: one machine), lock files beside the
database. Either way a holder that dies lets its locks go with its connection or its
file descriptors.
"""

from __future__ import annotations

import hashlib
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from filelock import FileLock, Timeout
from sqlalchemy import Connection, func, select
from sqlalchemy.engine import make_url

from core.db.session import get_engine

POLL_S = 0.2  # how often a waiting holder asks Postgres again


class Claims:
    """Locks taken one by one and all let go when the holder's `claims` block ends."""

    def __init__(self, url: str, stack: ExitStack) -> None:
        self._url = make_url(url)
        self._stack = stack
        self._connection: Connection | None = None

    def take(self, name: str, *, wait_s: float = 0.0) -> bool:
        """Hold `name`, waiting up to `wait_s` for another holder to let it go; whether
        it is held now."""
        if self._url.get_backend_name() == "postgresql":
            return self._advisory(name, wait_s)
        lock = FileLock(self._folder() / f"{_digest(name)}.lock")
        try:
            lock.acquire(timeout=wait_s, poll_interval=0.05)
        except Timeout:
            return False
        self._stack.callback(lock.release)
        return True

    def _advisory(self, name: str, wait_s: float) -> bool:
        if self._connection is None:
            engine = get_engine(self._url.render_as_string(hide_password=False), pooled=False)
            self._connection = self._stack.enter_context(
                engine.connect().execution_options(isolation_level="AUTOCOMMIT")
            )
        query = select(func.pg_try_advisory_lock(func.hashtextextended(name, 0)))
        deadline = time.monotonic() + wait_s
        while not self._connection.scalar(query):
            if time.monotonic() >= deadline:
                return False
            time.sleep(POLL_S)
        return True  # closing the connection lets it go

    def _folder(self) -> Path:
        database = self._url.database
        if database and database != ":memory:":
            folder = Path(database).resolve().parent / "locks"
        else:
            folder = Path(tempfile.gettempdir()) / "resnet-service-locks"
        folder.mkdir(parents=True, exist_ok=True)
        return folder


@contextmanager
def claims(url: str) -> Iterator[Claims]:
    """A holder of locks on the database at `url`; its locks go when the block ends."""
    with ExitStack() as stack:
        yield Claims(url, stack)


def _digest(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()[:32]

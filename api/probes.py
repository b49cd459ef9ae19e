"""Whether the database and the broker answer."""

from __future__ import annotations

from functools import lru_cache

import redis
from sqlalchemy import text

from core.db.session import get_engine
from core.queue import app_for
from core.settings import Settings


def check_database(url: str) -> None:
    """Run `SELECT 1`; raises when the database cannot be reached."""
    with get_engine(url).connect() as connection:
        connection.execute(text("SELECT 1"))


def check_broker(settings: Settings) -> None:
    """Connect to the broker (PING for Redis); raises when it cannot be reached."""
    url, timeout = settings.broker_url, settings.probe_timeout_seconds
    if _is_redis(url):
        _redis(url, timeout).ping()
        return
    with app_for(settings).connection_for_write(connect_timeout=timeout) as connection:
        connection.ensure_connection(max_retries=1, timeout=timeout)


def _is_redis(url: str) -> bool:
    return url.startswith(("redis://", "rediss://"))


@lru_cache(maxsize=8)
def _redis(url: str, timeout: float) -> redis.Redis:
    """One client (with its connection pool) per broker URL."""
    return redis.Redis.from_url(url, socket_connect_timeout=timeout, socket_timeout=timeout)

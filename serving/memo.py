"""Small caching tools: values kept for a while, and computations shared by their callers."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class TtlCache(Generic[K, V]):
    """Values kept for a time to live that each read chooses; `clear` forgets them all.

    A value computed from a read that straddles a `clear` is not kept: take `generation`
    before computing and pass it to `put`. Thread-safe (writes may come from worker threads).
    Ages are read from `clock` (seconds; a test passes one it can advance).
    """

    def __init__(
        self, *, max_entries: int = 1024, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.max_entries = max_entries
        self.clock = clock
        self.entries: dict[K, tuple[float, V]] = {}
        self.generation = 0  # bumped by `clear`
        self.lock = threading.Lock()

    def get(self, key: K, ttl_s: float) -> V | None:
        """The value kept for `key`, if younger than `ttl_s`."""
        found = self.entries.get(key)
        if found is None or self.clock() - found[0] >= ttl_s:
            return None
        return found[1]

    def put(self, key: K, value: V, generation: int) -> None:
        """Keep `value`, unless the cache was cleared since `generation` was read."""
        with self.lock:
            if generation != self.generation:
                return
            if len(self.entries) >= self.max_entries:
                self.entries.clear()
            self.entries[key] = (self.clock(), value)

    def clear(self) -> None:
        """Forget everything (what the values were read from changed)."""
        with self.lock:
            self.generation += 1
            self.entries.clear()


class SingleFlight(Generic[V]):
    """Concurrent calls for one key share one computation (a task on the event loop)."""

    def __init__(self) -> None:
        self.running: dict[Hashable, asyncio.Task[V]] = {}

    async def run(self, key: Hashable, compute: Callable[[], Awaitable[V]]) -> V:
        """The result of `compute()`, or of the call already running for `key`."""
        task = self.running.get(key)
        if task is None:
            task = asyncio.ensure_future(self._tracked(key, compute))
            self.running[key] = task
        # One waiter going away (its client disconnected) does not cancel the others'.
        return await asyncio.shield(task)

    async def _tracked(self, key: Hashable, compute: Callable[[], Awaitable[V]]) -> V:
        try:
            return await compute()
        finally:
            del self.running[key]

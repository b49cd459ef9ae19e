"""Serving trained models: an LRU cache of model processes, and resolved references.

Both live on the event loop (no locks): a miss of either is computed once however many
requests wait for it (`SingleFlight`), so a burst of first requests loads a model once
and an expired reference is resolved once.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Generic, TypeVar

from starlette.concurrency import run_in_threadpool

from api.model_process import Replicas, ServingOptions
from core.registry import Resolved

T = TypeVar("T")


class SingleFlight(Generic[T]):
    """Concurrent calls for one key share one computation (a task on the event loop)."""

    def __init__(self) -> None:
        self.running: dict[str, asyncio.Task[T]] = {}

    async def run(self, key: str, compute: Callable[[], Awaitable[T]]) -> T:
        """The result of `compute()`, or of the call already running for `key`."""
        task = self.running.get(key)
        if task is None:
            task = asyncio.ensure_future(self._tracked(key, compute))
            self.running[key] = task
        # One waiter going away (its client disconnected) does not cancel the others'.
        return await asyncio.shield(task)

    async def _tracked(self, key: str, compute: Callable[[], Awaitable[T]]) -> T:
        try:
            return await compute()
        finally:
            del self.running[key]


class ModelCache:
    """Model processes keyed by checkpoint sha256, bounded in count and bytes (LRU)."""

    def __init__(
        self,
        *,
        max_models: int = 4,
        max_bytes: int = 2 * 1024**3,
        options: ServingOptions | None = None,
    ) -> None:
        self.max_models, self.max_bytes = max_models, max_bytes
        self.options = options or ServingOptions()
        self.entries: OrderedDict[str, Replicas] = OrderedDict()
        self.starting: SingleFlight[Replicas] = SingleFlight()
        self.stopping: set[asyncio.Task[None]] = set()
        self.loads = 0

    def peek(self, sha256: str) -> Replicas | None:
        """The running model of a checkpoint (now the most recently used), or None."""
        served = self.entries.get(sha256)
        if served is None or served.closed:
            return None
        self.entries.move_to_end(sha256)
        return served

    async def get(self, path: Path, sha256: str) -> Replicas:
        """The model of a checkpoint, started (after its sha256 check) on a miss."""
        served = self.peek(sha256)
        if served is not None:
            return served
        return await self.starting.run(sha256, lambda: self._start(path, sha256))

    async def _start(self, path: Path, sha256: str) -> Replicas:
        served = await Replicas.start(path, sha256, self.options)
        stale = self.entries.pop(sha256, None)  # its process stopped
        if stale is not None:
            self._stop(stale)
        self.entries[sha256] = served
        self.loads += 1
        while len(self.entries) > 1 and (
            len(self.entries) > self.max_models
            or sum(e.bytes for e in self.entries.values()) > self.max_bytes
        ):
            # Never the newest; requests already sent to an evicted model are answered.
            self._stop(self.entries.popitem(last=False)[1])
        return served

    def _stop(self, served: Replicas) -> None:
        task = asyncio.ensure_future(served.close())
        self.stopping.add(task)
        task.add_done_callback(self.stopping.discard)

    async def close(self) -> None:
        """Stop every model process."""
        for served in self.entries.values():
            self._stop(served)
        self.entries.clear()
        if self.stopping:
            await asyncio.wait(set(self.stopping))


class RefCache:
    """Model references resolved a moment ago, for an app's predictions.

    Registry writes through the app `clear` it after their commit (from worker threads,
    hence the lock); a write through another process reaches its predictions within the
    time to live.
    """

    def __init__(self, *, max_entries: int = 1024) -> None:
        self.max_entries = max_entries
        self.entries: dict[str, tuple[float, Resolved]] = {}
        self.resolving: SingleFlight[Resolved] = SingleFlight()
        self.generation = 0  # bumped by `clear`: a resolution that straddles it is not kept
        self.lock = threading.Lock()

    def get(self, ref: str, ttl_s: float) -> Resolved | None:
        """The value kept for `ref`, if younger than `ttl_s`."""
        found = self.entries.get(ref)
        if found is None or time.monotonic() - found[0] >= ttl_s:
            return None
        return found[1]

    def put(self, ref: str, value: Resolved, generation: int) -> None:
        """Keep `value`, unless the cache was cleared since `generation` was read."""
        with self.lock:
            if generation != self.generation:
                return
            if len(self.entries) >= self.max_entries:
                self.entries.clear()
            self.entries[ref] = (time.monotonic(), value)

    def clear(self) -> None:
        """Forget everything (a registry write committed)."""
        with self.lock:
            self.generation += 1
            self.entries.clear()

    async def resolve(self, ref: str, ttl_s: float, load: Callable[[], Resolved]) -> Resolved:
        """The kept value of `ref`, else `load()` in a worker thread (once for all waiters)."""
        kept = self.get(ref, ttl_s)
        if kept is not None:
            return kept

        async def resolved() -> Resolved:
            generation = self.generation
            value = await run_in_threadpool(load)
            if ttl_s > 0:
                self.put(ref, value, generation)
            return value

        return await self.resolving.run(ref, resolved)

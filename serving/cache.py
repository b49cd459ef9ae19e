"""Serving trained models: an LRU cache of model processes, and resolved references.

Both live on the event loop: a miss of either is computed once however many requests
wait for it (`SingleFlight`), so a burst of first requests starts a model once and an
expired reference is resolved once. Admission happens here too: each model takes at most
its queue's worth of requests at once (counted from before their bodies are read), and
at most `max_starting` model processes start at once.
"""

from __future__ import annotations

import asyncio
from collections import Counter, OrderedDict
from collections.abc import Callable
from pathlib import Path

from starlette.concurrency import run_in_threadpool

from core.model_registry import Resolved
from serving.memo import SingleFlight, TtlCache
from serving.process import Overloaded, Replicas, ServingOptions


class ModelCache:
    """Model processes keyed by checkpoint sha256, bounded in count and bytes (LRU)."""

    def __init__(
        self,
        *,
        max_models: int = 4,
        max_bytes: int = 2 * 1024**3,
        options: ServingOptions | None = None,
        max_starting: int = 2,
        on_batch: Callable[[str, int], None] | None = None,
    ) -> None:
        self.max_models, self.max_bytes = max_models, max_bytes
        self.options = options or ServingOptions()
        self.entries: OrderedDict[str, Replicas] = OrderedDict()
        self.starting: SingleFlight[Replicas] = SingleFlight()
        self.stopping: set[asyncio.Task[None]] = set()
        self.loads = 0
        # Starting a model process costs seconds of CPU and its memory: a few at a time.
        self.start_slots = asyncio.Semaphore(max_starting)
        self.starting_now = self.peak_starting = 0
        self.admitted: Counter[str] = Counter()  # requests in hand per checkpoint sha256
        self.on_batch = on_batch  # told each forward pass's size (`Replicas.observe`)

    @property
    def max_admitted(self) -> int:
        """Requests one model takes at once: its processes' queues."""
        return self.options.max_queue * self.options.replicas

    def full(self, sha256: str) -> bool:
        """Whether the model has no request place free now."""
        return self.admitted[sha256] >= self.max_admitted

    @property
    def full_message(self) -> str:
        """What a request refused for a full queue is told."""
        return f"the model's request queue is full ({self.max_admitted} requests)"

    def admit(self, sha256: str) -> None:
        """Take one of the model's request places, or raise `Overloaded` when none is free.

        Taken before the request's body is read, so a request beyond the model's queue
        costs no parsing, decoding or memory; `release` gives the place back.
        """
        if self.full(sha256):
            raise Overloaded(self.full_message)
        self.admitted[sha256] += 1

    def release(self, sha256: str) -> None:
        """Give back a place `admit` took."""
        self.admitted[sha256] -= 1
        if self.admitted[sha256] <= 0:
            del self.admitted[sha256]

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
        served = await self._bounded_start(path, sha256)
        served.observe(self.on_batch)
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

    async def _bounded_start(self, path: Path, sha256: str) -> Replicas:
        """Start the model once a start slot is free; `Overloaded` if none frees in time."""
        wait_s = self.options.start_timeout_s
        try:
            await asyncio.wait_for(self.start_slots.acquire(), wait_s)
        except TimeoutError:
            raise Overloaded(
                f"{self.starting_now} models are starting and none finished within {wait_s:g} s"
            ) from None
        self.starting_now += 1
        self.peak_starting = max(self.peak_starting, self.starting_now)
        try:
            return await Replicas.start(path, sha256, self.options)
        finally:
            self.starting_now -= 1
            self.start_slots.release()

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


class RefCache(TtlCache[str, Resolved]):
    """Model references resolved a moment ago, for an app's predictions.

    Registry writes through the app `clear` it after their commit; a write through another
    process reaches its predictions within the time to live.
    """

    def __init__(self) -> None:
        super().__init__()
        self.resolving: SingleFlight[Resolved] = SingleFlight()

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

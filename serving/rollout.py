"""Rollout between a registered model's versions: which version of a weighted alias serves
a request, and the shadow tap that copies a share of an alias's traffic to a candidate.

The registry resolves an alias once (cached, `RefCache`) into its versions and their
cumulative weights (`core.model_registry.Rollout`); `choose` picks one per request from
that, with no database and no allocation: a random point of `[0, total)`, or for a sticky
alias a hash of the caller (its API key id, else the `X-Session-Key` it sends) into the
same range, as consistent-hashing canaries do. Versions take their ranges oldest first,
so moving weight towards a newer version moves only the callers between the old and the
new bound, and a caller already on the newer version stays there.

`ShadowTap` is a data plane tap (`serving.dataplane.Tap`): a batch answered through an
alias with a shadow is queued (bounded) for the shadow version, whose answer is compared
with the primary's (top-1 agreement, mean |p difference|, latency) and never returned.
It is shed first: dropped and counted when its queue is full or the primary model's queue
is more than half full, and it never waits.
"""

from __future__ import annotations

import asyncio
import bisect
import hashlib
import logging
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from core.model_registry import Resolved, Rollout
from core.owners import Caller
from serving.cache import ModelCache
from serving.metrics import ModelMetrics
from serving.process import Images, Probabilities, Replicas


class Batch(Protocol):
    """What the tap reads of a served batch (`serving.dataplane.Served`)."""

    @property
    def target(self) -> Resolved: ...
    @property
    def images(self) -> Images: ...
    @property
    def probabilities(self) -> Probabilities: ...


class Plane(Protocol):
    """What the shadow needs of the data plane (`serving.dataplane.DataPlane`)."""

    models: ModelCache
    metrics: ModelMetrics
    taps: list[Callable[[Any], None]]

    async def model_of(self, target: Resolved) -> Replicas: ...


log = logging.getLogger(__name__)
SESSION_HEADER = "x-session-key"  # a caller without an API key keeps its version by this
VERSION_HEADER = "X-Model-Version"  # every prediction answer names what served it
VERSION_HEADER_RAW = VERSION_HEADER.lower().encode("latin-1")  # appended as is: no dict to parse
QUEUE_SIZE = 64  # shadow copies waiting at most, over all shadows
WORKERS = 4  # shadow copies forwarded at once
_HASH_SPAN = 2**64


def choose(target: Resolved, caller: Caller, session_key: str | None) -> Resolved:
    """The version that serves this request: `target` itself unless it is a weighted
    alias, then one of its versions in proportion to their weights."""
    rollout = target.rollout
    if rollout is None:
        return target
    return rollout.arms[bisect.bisect_right(rollout.bounds, point(rollout, caller, session_key))]


def point(rollout: Rollout, caller: Caller, session_key: str | None) -> int:
    """A point of `[0, total weight)`: the caller's hash for a sticky alias (when the caller
    is known), else random."""
    total = rollout.bounds[-1]
    if rollout.sticky:
        owner = caller.owner
        key = owner.bytes if owner is not None else session_key.encode() if session_key else None
        if key is not None:
            return (sticky_hash(rollout.alias, key) * total) // _HASH_SPAN
    return random.randrange(total)


def sticky_hash(alias: str, key: bytes) -> int:
    """A caller's 64-bit hash for one alias (the same in every API process)."""
    digest = hashlib.blake2b(key, digest_size=8, salt=alias.encode()[:16]).digest()
    return int.from_bytes(digest, "big")


@dataclass(slots=True)
class Comparison:
    """A shadow's figures against one primary version, since the API started."""

    images: int = 0
    agreed: int = 0  # images whose top-1 class was the primary's
    abs_diff: float = 0.0  # summed per image: mean over classes of |p_shadow - p_primary|
    seconds: float = 0.0  # summed latency of the shadow's forwards
    forwards: int = 0
    dropped: int = 0
    failed: int = 0

    def described(self) -> dict[str, float | int | None]:
        """The figures as the API answers them."""
        images, forwards = self.images, self.forwards
        return {
            "images": images,
            "agreement": self.agreed / images if images else None,
            "mean_abs_diff": self.abs_diff / images if images else None,
            "mean_latency_ms": 1000 * self.seconds / forwards if forwards else None,
            "dropped": self.dropped,
            "failed": self.failed,
        }


Load = Callable[[Resolved], Awaitable[Replicas]]  # a resolved version's running model
_Copy = tuple[Resolved, Batch]


class ShadowTap:
    """Copies a share of each shadowed alias's batches to its shadow version, compares the
    answers and keeps the figures (`comparisons`, and the metrics' shadow series)."""

    def __init__(
        self,
        cache: ModelCache,
        load: Load,
        metrics: ModelMetrics,
        *,
        queue_size: int = QUEUE_SIZE,
        workers: int = WORKERS,
    ) -> None:
        self.cache, self.load, self.metrics = cache, load, metrics
        self.queue: asyncio.Queue[_Copy] = asyncio.Queue(queue_size)
        self.workers = workers
        self.tasks: list[asyncio.Task[None]] = []
        # By (model, alias' primary version label, shadow label).
        self.comparisons: dict[tuple[str, str, str], Comparison] = {}

    def __call__(self, served: Batch) -> None:
        """Queue a copy of the batch for the shadow, or drop it; never waits."""
        shadow = served.target.shadow
        if shadow is None:
            return
        if shadow.percent < 100 and random.random() * 100 >= shadow.percent:
            return
        primary = served.target
        if self.cache.admitted[primary.sha256] * 2 > self.cache.max_admitted:
            self._dropped(primary, shadow.target, "primary_busy")
            return
        try:
            self.queue.put_nowait((shadow.target, served))
        except asyncio.QueueFull:
            self._dropped(primary, shadow.target, "shadow_busy")
            return
        if not self.tasks:
            self.tasks = [asyncio.ensure_future(self._work()) for _ in range(self.workers)]

    def figures(self, model: str) -> list[tuple[str, str, Comparison]]:
        """The model's comparisons: (primary label, shadow label, figures)."""
        return [(p, s, c) for (m, p, s), c in sorted(self.comparisons.items()) if m == model]

    async def close(self) -> None:
        """Stop the workers (copies still queued are dropped)."""
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        self.tasks = []

    async def _work(self) -> None:
        while True:
            shadow, served = await self.queue.get()
            try:
                await self._compare(shadow, served)
            except Exception:  # a shadow never fails anything but its own figures
                figures = self._of(served.target, shadow)
                if not figures.failed:  # once per pair: a broken shadow fails every copy
                    log.exception("the shadow %s failed on a copy", _label(shadow))
                figures.failed += 1
                self.metrics.shadow_dropped(_label(shadow), "failed")

    async def _compare(self, shadow: Resolved, served: Batch) -> None:
        model = await self.load(shadow)
        started = time.perf_counter()  # after a cold start: the latency a request would see
        info = model.info
        if served.images.shape[1:] != (info.channels, *info.image_size):
            self._dropped(served.target, shadow, "input_differs")
            return
        probabilities, _ = await model.predict_timed(served.images, _label(shadow))
        seconds = time.perf_counter() - started
        primary = served.probabilities
        if probabilities.shape != primary.shape:
            self._dropped(served.target, shadow, "classes_differ")
            return
        agreed = int(np.count_nonzero(probabilities.argmax(1) == primary.argmax(1)))
        diffs = np.abs(probabilities - primary).mean(axis=1)
        figures = self._of(served.target, shadow)
        figures.images += len(diffs)
        figures.agreed += agreed
        figures.abs_diff += float(diffs.sum())
        figures.seconds += seconds
        figures.forwards += 1
        self.metrics.shadowed(_label(served.target), _label(shadow), agreed, diffs, seconds)

    def _of(self, primary: Resolved, shadow: Resolved) -> Comparison:
        key = (primary.model or "", _label(primary), _label(shadow))
        figures = self.comparisons.get(key)
        if figures is None:
            figures = self.comparisons[key] = Comparison()
        return figures

    def _dropped(self, primary: Resolved, shadow: Resolved, reason: str) -> None:
        self._of(primary, shadow).dropped += 1
        self.metrics.shadow_dropped(_label(shadow), reason)


def _label(target: Resolved) -> str:
    return f"{target.model}/{target.version}"


@asynccontextmanager
async def shadowing(plane: Plane) -> AsyncIterator[ShadowTap]:
    """A shadow tap on the plane (its copies loaded through the plane's model cache), for
    as long as the context lasts."""
    tap = ShadowTap(plane.models, plane.model_of, plane.metrics)
    plane.taps.append(tap)
    try:
        yield tap
    finally:
        plane.taps.remove(tap)
        await tap.close()


def shadow_tap(plane: Plane) -> ShadowTap | None:
    """The plane's shadow tap, if it has one."""
    return next((tap for tap in plane.taps if isinstance(tap, ShadowTap)), None)

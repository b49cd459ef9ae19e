"""Rollouts in the data plane: the per-request choice of a weighted alias's version (its
split, stickiness and consistency), and the shadow tap (compared, shed, never waited on)."""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, cast

import numpy as np
from prometheus_client import CollectorRegistry

from core import model_registry
from core.db.session import session_scope
from core.keys import Principal
from core.model_registry import Resolved, Rollout, Shadow
from core.owners import Caller
from core.settings import Settings
from serving import rollout
from serving.cache import ModelCache, RefCache
from serving.dataplane import DataPlane, Files, Served
from serving.files import Upload
from serving.metrics import ModelMetrics
from serving.process import ServingOptions
from tests import images
from tests.helpers import TINY, trained_job

ANYONE = Caller()
DRAWS = 2000


def _target(version: int, shadow: Shadow | None = None) -> Resolved:
    return Resolved("m@production", uuid.uuid4(), "m", version, "/x.pt", f"{version:064x}", 1,
                    shadow=shadow)  # fmt: skip


def _weighted(weights: dict[int, int], *, sticky: bool = False) -> Resolved:
    """A weighted alias's resolution, as the registry makes it."""
    arms = tuple(_target(version) for version in sorted(weights))
    bounds = tuple(np.cumsum([weights[v] for v in sorted(weights)]).tolist())
    return Resolved("m@production", arms[0].job_id, "m", 3, "/x.pt", "0" * 64, 1,
                    rollout=Rollout("production", arms, bounds, sticky))  # fmt: skip


def _bound(draws: int, share: float) -> float:
    """Four binomial standard deviations: a correct split leaves it once in 16,000 runs."""
    return 4 * math.sqrt(draws * share * (1 - share))


def test_an_unweighted_reference_is_served_as_it_resolved() -> None:
    target = _target(3)
    assert rollout.choose(target, ANYONE, "anything") is target


def test_the_split_holds_its_weights_within_the_binomial_bound() -> None:
    alias = _weighted({3: 90, 4: 10})
    counts = Counter(rollout.choose(alias, ANYONE, None).version for _ in range(DRAWS))
    assert set(counts) == {3, 4}
    assert abs(counts[4] - DRAWS * 0.1) <= _bound(DRAWS, 0.1), counts


def test_a_sticky_caller_keeps_its_version_and_callers_split_by_the_weights() -> None:
    alias = _weighted({3: 90, 4: 10}, sticky=True)
    keys = [f"session-{n}" for n in range(DRAWS)]
    first = {key: rollout.choose(alias, ANYONE, key).version for key in keys}
    assert all(rollout.choose(alias, ANYONE, key).version == first[key] for key in keys[:200])
    on_four = sum(version == 4 for version in first.values())
    assert abs(on_four - DRAWS * 0.1) <= _bound(DRAWS, 0.1), on_four
    # More weight to 4: only callers between the old and the new bound move, all to 4.
    wider = _weighted({3: 80, 4: 20}, sticky=True)
    then = {key: rollout.choose(wider, ANYONE, key).version for key in keys}
    moved = [key for key in keys if then[key] != first[key]]
    assert all((first[key], then[key]) == (3, 4) for key in moved)
    assert abs(len(moved) - DRAWS * 0.1) <= _bound(DRAWS, 0.1), len(moved)


def test_a_keyed_caller_is_sticky_by_its_key_whatever_session_it_sends() -> None:
    alias = _weighted({3: 50, 4: 50}, sticky=True)
    callers = [Caller(Principal(uuid.uuid4(), frozenset({"predict"}))) for _ in range(200)]
    versions = {rollout.choose(alias, caller, None).version for caller in callers}
    assert versions == {3, 4}
    for caller in callers[:50]:
        mine = rollout.choose(alias, caller, None).version
        assert {rollout.choose(alias, caller, f"s{n}").version for n in range(10)} == {mine}


def _served(target: Resolved) -> Served:
    pixels = np.zeros((1, 3, 8, 8), np.uint8)
    return Served(target, ANYONE, pixels, np.full((1, 10), 0.1, np.float32), 0.001)


def test_the_shadow_is_shed_first_and_never_waited_on() -> None:
    async def run() -> None:
        cache = ModelCache(options=ServingOptions(max_queue=4))
        release = asyncio.Event()

        async def stuck(target: Resolved) -> object:
            await release.wait()
            raise RuntimeError("unloaded")

        metrics = ModelMetrics(CollectorRegistry())
        tap = rollout.ShadowTap(cache, stuck, metrics, queue_size=1, workers=1)  # type: ignore[arg-type]
        primary = _target(3, Shadow(_target(5), 100))
        started = time.perf_counter()
        for _ in range(4):  # one taken by the worker, one queued, two dropped
            tap(_served(primary))
            await asyncio.sleep(0)
        assert time.perf_counter() - started < 0.1
        cache.admitted[primary.sha256] = 3  # the primary's queue more than half full
        tap(_served(primary))
        (figures,) = tap.comparisons.values()
        assert figures.dropped == 3
        drops = {
            sample.labels["reason"]: sample.value
            for sample in next(iter(metrics.shadow_drops.collect())).samples
            if sample.name.endswith("_total")
        }
        assert drops == {"shadow_busy": 2, "primary_busy": 1}
        tap(_served(_target(3)))  # no shadow: nothing queued, nothing counted
        assert figures.dropped == 3
        release.set()  # the shadow's load fails: the copy taken, then the one queued
        for _ in range(200):
            if figures.failed == 2:
                break
            await asyncio.sleep(0.005)
        assert (figures.failed, figures.images) == (2, 0)
        await tap.close()

    asyncio.run(run())


def _files(data: bytes) -> Files:
    @asynccontextmanager
    async def read() -> AsyncIterator[list[Upload]]:
        yield [Upload("one.png", data, len(data))]

    return read


def test_a_weighted_alias_serves_each_version_and_its_shadow_compares(settings: Settings) -> None:
    recipe: dict[str, Any] = {**cast(dict[str, Any], TINY["recipe"]), "seed": 1}
    seeded = {**TINY, "recipe": recipe}  # other weights: a process of its own
    job, other = trained_job(settings), trained_job(settings, seeded)
    name = f"roll-{uuid.uuid4().hex[:8]}"
    with session_scope(settings.database_url) as session:
        for made, checkpoint in ((job, "best"), (job, "1"), (other, "best")):
            model_registry.register(session=session, name=name, job_id=made, checkpoint=checkpoint)
        model_registry.set_alias(
            session=session, name=name, alias="production", weights={1: 50, 2: 50},
            shadow=(3, 100),
        )  # fmt: skip
    png = images.flat_png((200, 30, 30))

    async def run() -> tuple[Counter[int | None], dict[tuple[str, str, str], rollout.Comparison]]:
        cache = ModelCache(options=ServingOptions(threads=1))
        metrics = ModelMetrics(CollectorRegistry())
        plane = DataPlane(settings, cache, RefCache(), metrics)
        served: Counter[int | None] = Counter()
        try:
            async with rollout.shadowing(plane) as tap:
                for _ in range(20):
                    answer = await plane.predict(
                        f"{name}@production", ANYONE, _files(png), status_of=lambda _: 500
                    )
                    served[answer.target.version] += 1
                deadline = time.monotonic() + 60
                while sum(c.images + c.dropped for c in tap.comparisons.values()) < 20:
                    assert time.monotonic() < deadline, tap.comparisons
                    await asyncio.sleep(0.05)
                requests = {
                    s.labels["version"]: s.value
                    for s in next(iter(metrics.rollout.collect())).samples
                    if s.name.endswith("_total")
                }
                assert requests == {str(v): float(n) for v, n in served.items()}
                assert len(cache.entries) == 3  # the shadow started through the same cache
                return served, dict(tap.comparisons)
        finally:
            await cache.close()

    served, comparisons = asyncio.run(run())
    assert set(served) == {1, 2}  # the shadow (3) never answers
    assert {key[2] for key in comparisons} == {f"{name}/3"}
    compared = sum(c.images for c in comparisons.values())
    assert compared >= 1
    for figures in comparisons.values():
        described = figures.described()
        if figures.images:
            assert 0 <= described["agreement"] <= 1  # type: ignore[operator]
            assert 0 <= described["mean_abs_diff"] <= 1  # type: ignore[operator]
            assert described["mean_latency_ms"] > 0  # type: ignore[operator]

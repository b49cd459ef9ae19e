"""The payload log: the tap's sample and its bounded buffer, segments written by a real
data plane's model processes to a local folder and to S3 (moto), the bounds of size and
age, segments a store refuses put again after a wait (and the bound on those kept), and a
store that hangs never holding back an answer."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import inspect
import io
import math
import random
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from prometheus_client import CollectorRegistry

from core import layout
from core.model_registry import Resolved
from core.owners import Caller
from core.settings import Settings
from core.storage import LocalStore, S3Store, Store, StoreUnavailableError
from serving import payloads
from serving.cache import ModelCache, RefCache
from serving.dataplane import DataPlane, Served
from serving.metrics import ModelMetrics, WatchMetrics
from serving.process import ServingOptions
from tests import images
from tests.core.test_storage import s3_settings
from tests.helpers import caller_of, trained_job
from tests.serving.test_dataplane import files_of, status

CLASSES = ("a", "b", "c")
JOB = uuid.UUID(int=7)


def target(model: str | None = "digits", version: int | None = 2) -> Resolved:
    """A resolved reference, as the data plane hands its taps."""
    ref = f"{model}/{version}" if model else str(JOB)
    return Resolved(ref, JOB, model, version, "/nowhere/best.pt", "f" * 64, 2)


def batch(count: int, seed: int = 0, at: Resolved | None = None) -> Served:
    """An answered batch of `count` random 3 x 4 x 4 images with random probabilities."""
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, size=(count, 3, 4, 4), dtype=np.uint8)
    scores = rng.random((count, len(CLASSES))).astype(np.float32)
    return Served(at or target(), Caller(), pixels, scores / scores.sum(1, keepdims=True), 0.004)


def payload_log(
    settings: Settings, store: Store, clock: Callable[[], float] = time.monotonic, **changes: object
) -> payloads.PayloadLog:
    """A payload log of `settings` changed by `changes`, with a seeded draw (and `clock`)."""
    changed = settings.model_copy(update=changes)
    metrics = WatchMetrics(CollectorRegistry())
    return payloads.PayloadLog(
        changed,
        store,
        metrics,
        lambda _: CLASSES,
        rng=random.Random(7).random,
        clock=clock,
    )


def counted(log: payloads.PayloadLog, name: str, **labels: str) -> float:
    """A payload log counter's value."""
    return getattr(log.metrics, name).labels(**labels)._value.get()  # type: ignore[no-any-return]


@pytest.fixture
def local(tmp_path: Path) -> LocalStore:
    """A local store in the test's folder."""
    return LocalStore(tmp_path / "artifacts")


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    """Each test that asks for it runs on a local folder and on an S3 bucket (moto)."""
    if request.param == "local":
        return LocalStore(tmp_path / "artifacts")
    return S3Store(s3_settings(request.getfixturevalue("s3_url"), tmp_path))


def test_the_tap_draws_the_share_asked_and_never_awaits(
    local_settings: Settings, local: LocalStore
) -> None:
    log = payload_log(local_settings, local, payload_log_sample=0.3, payload_log_buffer=10**6)
    assert not inspect.iscoroutinefunction(log.tap)
    for seed in range(100):
        assert log.tap(batch(20, seed)) is None  # type: ignore[func-returns-value]
    # 2,000 images drawn at 0.3: within 5 standard deviations (20.5) of 600.
    assert abs(log.buffered - 600) < 5 * (2000 * 0.3 * 0.7) ** 0.5
    assert log.dropped == 0
    off = payload_log(local_settings, local, payload_log_sample=0.0)
    off.tap(batch(20))
    assert off.buffered == 0


def test_a_full_buffer_drops_and_counts_what_it_cannot_hold(
    local_settings: Settings, local: LocalStore
) -> None:
    log = payload_log(local_settings, local, payload_log_sample=1.0, payload_log_buffer=5)
    for seed in range(3):
        log.tap(batch(4, seed))
    assert log.buffered == 5
    assert [len(sampled.indexes) for sampled in log.buffer] == [4, 1]
    # The image kept of the second batch is held alone, not with the batch it came in.
    assert log.buffer[1].served.images.shape == (1, 3, 4, 4)
    assert np.array_equal(log.buffer[1].served.images[0], batch(4, 1).images[0])
    assert log.dropped == 7
    assert counted(log, "dropped", model="digits/2") == 7


def test_records_hold_the_digest_answer_and_image_the_model_took(
    local_settings: Settings, store: Store
) -> None:
    log = payload_log(local_settings, store, payload_log_sample=1.0, payload_log_images=True)
    served = batch(3)
    log.tap(served)
    log.tap(batch(2, seed=1, at=target(None, None)))
    asyncio.run(log.flush())
    (segment,) = payloads.segments(store, layout.payload_prefix("digits", 2))
    assert segment.records == 3
    assert segment.first <= segment.last
    path = store.fetch(segment.key, segment.sha256)  # verified against the name's sha256
    records = list(payloads.read_records(path))
    for index, found in enumerate(records):
        pixels = served.images[index]
        assert found["sha256"] == hashlib.sha256(pixels.tobytes()).hexdigest()
        png = Image.open(io.BytesIO(base64.b64decode(found["image_png"])))
        assert np.array_equal(np.asarray(png).transpose(2, 0, 1), pixels)
        best = int(served.probabilities[index].argmax())
        assert found["top"][0] == {
            "label": CLASSES[best],
            "index": best,
            "probability": pytest.approx(float(served.probabilities[index][best])),
        }
        assert found["model"] == "digits"
        assert found["version"] == 2
        assert found["latency_ms"] == 4.0
    (job_segment,) = payloads.segments(store, layout.job_payload_prefix(JOB))
    assert job_segment.records == 2
    assert counted(log, "logged", model="digits/2") == 3


def test_the_oldest_segments_go_beyond_the_bytes_bound(
    local_settings: Settings, store: Store
) -> None:
    log = payload_log(local_settings, store, payload_log_sample=1.0, payload_log_batch=4)
    log.tap(batch(4))
    asyncio.run(log.flush())
    (one,) = payloads.segments(store, layout.payload_prefix("digits", 2))
    # Room for two segments and a half: the third written pushes out the first.
    log.settings = log.settings.model_copy(update={"payload_log_max_bytes": int(one.bytes * 2.5)})
    for seed in (1, 2):
        time.sleep(0.002)  # a later first record, so a later name
        log.tap(batch(4, seed))
        asyncio.run(log.flush())
    kept = payloads.segments(store, layout.payload_prefix("digits", 2))
    assert len(kept) == 2
    assert one.name not in [segment.name for segment in kept]
    assert sum(segment.bytes for segment in kept) <= log.settings.payload_log_max_bytes
    assert counted(log, "deleted", reason="bytes") == 1


def test_segments_older_than_the_age_bound_go(local_settings: Settings, store: Store) -> None:
    log = payload_log(local_settings, store, payload_log_sample=1.0, payload_log_max_age_days=1)
    prefix = layout.payload_prefix("digits", 2)
    old = payloads.Sampled(batch(2), (0, 1), time.time() - 3 * 86400, CLASSES)
    old_key = payloads.put_segment(store, prefix, [payloads.record(old, 0, False)])
    elsewhere = layout.payload_prefix("other", 1)
    other_key = payloads.put_segment(store, elsewhere, [payloads.record(old, 1, False)])
    log.tap(batch(2))
    asyncio.run(log.flush())  # its first flush sweeps every version's age bound too
    kept = payloads.segments(store, prefix)
    assert [segment.records for segment in kept] == [2]
    assert old_key not in [segment.key for segment in kept]
    assert payloads.segments(store, elsewhere) == []
    assert other_key not in store.keys(layout.PAYLOADS + "/")
    assert counted(log, "deleted", reason="age") == 2


class RefusingStore(LocalStore):
    """A local store whose first `refusals` puts fail as an unreachable store's do."""

    def __init__(self, root: Path, refusals: float) -> None:
        super().__init__(root)
        self.refusals, self.tries = refusals, 0

    def put(self, key: str, source: Path, sha256: str) -> None:
        self.tries += 1
        if self.tries <= self.refusals:
            raise StoreUnavailableError("the store is down")
        super().put(key, source, sha256)


class ManualClock:
    """A clock the test moves."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def stored(store: Store, prefix: str) -> list[tuple[str, str]]:
    """(time, sha256) of every stored record under `prefix`, segment by segment in name order."""
    return [
        (found["time"], found["sha256"])
        for segment in payloads.segments(store, prefix)
        for found in payloads.read_records(store.fetch(segment.key, segment.sha256))
    ]


def test_refused_segments_are_put_again_after_a_wait_once_and_in_order(
    local_settings: Settings, tmp_path: Path
) -> None:
    store, clock = RefusingStore(tmp_path / "artifacts", refusals=3), ManualClock()
    log = payload_log(
        local_settings,
        store,
        clock,
        payload_log_sample=1.0,
        payload_log_batch=2,
        payload_log_flush_seconds=10,
    )
    tries = []
    for seed in range(6):
        time.sleep(0.002)  # each batch a later time
        log.tap(batch(2, seed))
        asyncio.run(log.flush())
        tries.append(store.tries)
        clock.now += 10  # a flush interval
    # Refused at 0; put again 10 s later (refused), then 20 s (at 30: refused), then 40 s.
    assert tries == [1, 2, 2, 3, 3, 3]
    assert (log.pending_records, log.lost) == (12, 0)
    clock.now += 10  # 40 s after the third refusal
    asyncio.run(log.flush())
    assert (log.pending, log.lost) == (deque(), 0)
    served = [payloads.digest(image) for seed in range(6) for image in batch(2, seed).images]
    found = stored(store, layout.payload_prefix("digits", 2))
    assert [sha256 for _, sha256 in found] == served  # every record once, in order
    assert [at for at, _ in found] == sorted(at for at, _ in found)
    assert counted(log, "logged", model="digits/2") == 12
    assert counted(log, "lost", model="digits/2") == 0


def test_a_store_that_always_refuses_keeps_at_most_the_bound_and_counts_the_rest_lost(
    local_settings: Settings, tmp_path: Path
) -> None:
    store, clock = RefusingStore(tmp_path / "artifacts", refusals=math.inf), ManualClock()
    log = payload_log(local_settings, store, clock, payload_log_sample=1.0, payload_log_buffer=10)
    for seed in range(8):
        log.tap(batch(3, seed))
        asyncio.run(log.flush())
        clock.now += 1000  # past every wait: each flush tries again
        assert log.pending_records <= 10
    assert log.pending_records == 10
    assert log.lost == 24 - 10
    assert counted(log, "lost", model="digits/2") == 14
    # The newest are those kept: the oldest went first.
    kept = [found["sha256"] for pending in log.pending for found in pending.records]
    newest = [payloads.digest(image) for seed in range(4, 8) for image in batch(3, seed).images]
    assert kept == newest[-10:]
    log.stop()
    asyncio.run(log.run())  # a stop with the store still refusing: what was kept is lost
    assert (log.pending_records, log.lost) == (0, 24)
    assert payloads.segments(store, layout.payload_prefix("digits", 2)) == []


class HangingStore(LocalStore):
    """A local store whose writes wait until released (an object store that hangs)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.entered, self.unblocked = threading.Event(), threading.Event()

    def put(self, key: str, source: Path, sha256: str) -> None:
        self.entered.set()
        assert self.unblocked.wait(30), "the test never released the store"
        super().put(key, source, sha256)


@pytest.fixture(scope="module")
def job(settings: Settings) -> uuid.UUID:
    """A succeeded train job (ResNet-8 on 8x8 synthetic images) with a best checkpoint."""
    return trained_job(settings)


def test_a_hanging_store_holds_back_no_answer_and_a_stop_loses_nothing(
    settings: Settings, job: uuid.UUID, tmp_path: Path
) -> None:
    store = HangingStore(tmp_path / "artifacts")
    caller = caller_of(settings.database_url, "predict")
    files = files_of(("red.png", images.flat_png((255, 0, 0))), ("grey.png", images.flat_png()))

    async def work() -> None:
        cache = ModelCache(options=ServingOptions(threads=1))
        plane = DataPlane(settings, cache, RefCache(), ModelMetrics(CollectorRegistry()))
        log = payload_log(settings, store, payload_log_sample=1.0, payload_log_batch=2)
        log.classes = lambda sha256: cache.peek(sha256).info.classes  # type: ignore[union-attr]
        plane.taps.append(log.tap)
        running = asyncio.create_task(log.run())
        try:
            await plane.predict(str(job), caller, files, status_of=status)
            # The batch woke the writer, which now hangs in the store's put...
            assert await asyncio.to_thread(store.entered.wait, 30)
            started = time.perf_counter()
            for _ in range(3):  # ...while the next predictions are answered all the same.
                answer = await asyncio.wait_for(
                    plane.predict(str(job), caller, files, status_of=status), 30
                )
                assert answer.probabilities.shape[0] == 2
            assert time.perf_counter() - started < 10
            assert not store.unblocked.is_set()
            assert log.buffered == 6
        finally:
            store.unblocked.set()
            log.stop()
            await running
            await cache.close()

    asyncio.run(work())
    found = payloads.segments(store, layout.job_payload_prefix(job))
    assert sum(segment.records for segment in found) == 8  # what was buffered at the stop too
    records = [
        record
        for segment in found
        for record in payloads.read_records(store.fetch(segment.key, segment.sha256))
    ]
    assert {record["caller"] for record in records} == {str(caller.owner)}
    assert {record["job_id"] for record in records} == {str(job)}

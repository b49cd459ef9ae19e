"""What the payload log's and the drift monitor's taps cost the event loop, per answered batch.

Each tap is called `--calls` times with one answered batch of 32x32 RGB images (batch 1
and 64): the payload tap at a sample of 0.1 and of 1, its buffer emptied every 512 records
as a write would take it; the drift tap (what it notes trimmed to a window, as between two
folds). It prints microseconds per call; nothing is written to a store.

    .venv/bin/python -m bench.payload_tap
    .venv/bin/python -m bench.payload_tap --calls 5000     # quicker
"""

from __future__ import annotations

import argparse
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import numpy as np
from prometheus_client import CollectorRegistry

from core.model_registry import Resolved
from core.owners import Caller
from core.settings import Settings
from core.storage import LocalStore
from serving.dataplane import Served
from serving.drift import DriftMonitor
from serving.metrics import WatchMetrics
from serving.payloads import PayloadLog
from training.data import DatasetInfo

EMPTIED_EVERY = 512  # records between two writes
INFO = DatasetInfo("bench", tuple(map(str, range(10))), 3, (32, 32), (0.5,) * 3, (0.25,) * 3)


def batch(size: int) -> Served:
    """An answered batch of `size` random 32x32 images."""
    target = Resolved("bench/1", uuid.uuid4(), "bench", 1, "/nowhere", "e" * 64, 1)
    images = np.random.default_rng(0).integers(0, 256, (size, 3, 32, 32), dtype=np.uint8)
    probabilities = np.full((size, 10), 0.1, dtype=np.float32)
    return Served(target, Caller(), images, probabilities, 0.01)


def timed(calls: int, once: Callable[[], None]) -> float:
    """Microseconds per call of `once`."""
    started = time.perf_counter()
    for _ in range(calls):
        once()
    return (time.perf_counter() - started) / calls * 1e6


def payload_tap(served: Served, sample: float, calls: int) -> float:
    """Microseconds per payload tap at `sample`, the buffer emptied as a write would."""
    settings = Settings(payload_log_sample=sample, payload_log_buffer=10**6)
    log = PayloadLog(
        settings,
        LocalStore(Path("/nonexistent")),
        WatchMetrics(CollectorRegistry()),
        lambda _: INFO.classes,
    )

    def once() -> None:
        log.tap(served)
        if log.buffered >= EMPTIED_EVERY:
            log.buffer, log.buffered = [], 0

    return timed(calls, once)


def drift_tap(served: Served, calls: int) -> float:
    """Microseconds per drift tap (its folds apart)."""
    monitor = DriftMonitor(Settings(), WatchMetrics(CollectorRegistry()), lambda _: INFO)
    return timed(calls, lambda: monitor.tap(served))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20_000)
    calls = parser.parse_args().calls
    print("| batch | payload tap, sample 0.1 | payload tap, sample 1 | drift tap |")
    print("| ---: | ---: | ---: | ---: |")
    for size in (1, 64):
        served = batch(size)
        tenth, whole = (payload_tap(served, sample, calls) for sample in (0.1, 1.0))
        print(f"| {size} | {tenth:.1f} µs | {whole:.1f} µs | {drift_tap(served, calls):.1f} µs |")


if __name__ == "__main__":
    main()

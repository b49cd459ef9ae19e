"""Drift: the window's statistics against numbers worked by hand, its bounds, the class
reference a checkpoint's data gives, the monitor turned off, and a real data plane serving
digits whose inverted images raise the shift (and its gauge)."""

from __future__ import annotations

import asyncio
import math
import uuid
from typing import Any

import numpy as np
import pytest
from PIL import Image
from prometheus_client import CollectorRegistry

from core.errors import ConflictError
from core.model_registry import Resolved
from core.owners import Caller
from core.settings import Settings
from serving.cache import ModelCache, RefCache
from serving.dataplane import DataPlane, Served
from serving.drift import TRAINING_SPLIT, UNIFORM, DriftMonitor, Reference, Window
from serving.metrics import ModelMetrics, WatchMetrics
from serving.process import ServingOptions
from tests import images
from tests.helpers import trained_job
from tests.serving.test_dataplane import files_of, status
from training.data import DatasetInfo, TensorSplit
from training.datasets import load_dataset
from training.specs import TrainSpec

REFERENCE = Reference(
    (0.5, 0.5, 0.5), (0.25, 0.25, 0.25), ("a", "b", "c", "d"), (0.25,) * 4, UNIFORM
)
DIGITS = {
    "model": {"name": "resnet8"},
    "dataset": {"name": "digits", "validation": 0},
    "recipe": {"iterations": 2, "batch_size": 16, "checkpoint_every": 1},
}


def flat(*levels: int) -> np.ndarray[Any, np.dtype[np.uint8]]:
    """A 2 x 2 image whose channels are flat at `levels` (0..255)."""
    return np.array([np.full((2, 2), level) for level in levels], dtype=np.uint8)


def answered(predicted: list[int], classes: int = 4) -> np.ndarray[Any, np.dtype[np.float32]]:
    """Probabilities whose top class is `predicted`, image by image."""
    scores = np.full((len(predicted), classes), 0.1, dtype=np.float32)
    scores[np.arange(len(predicted)), predicted] = 0.7
    return scores


def test_the_statistics_are_those_worked_by_hand() -> None:
    window = Window(REFERENCE, 100)
    # Channel 0 at 0.2 and 0.6, channel 1 at 0.4 in both, channel 2 at 1.0 and 0.0.
    window.add(np.stack([flat(51, 102, 255), flat(153, 102, 0)]), answered([0, 0]), 1.0)
    drift = window.drift()
    assert drift.images == 2
    assert drift.served_mean == pytest.approx([0.4, 0.4, 0.5])
    assert drift.served_std == pytest.approx([0.2, 0.0, 0.5], abs=1e-7)
    assert drift.shift == pytest.approx([0.4, 0.4, 0.0])  # |mean - 0.5| / 0.25
    assert drift.std_ratio == pytest.approx([0.8, 0.0, 2.0], abs=1e-6)
    assert drift.counts == [2, 0, 0, 0]
    # All in class a against a uniform four: TV = (0.75 + 3 x 0.25) / 2.
    assert drift.total_variation == pytest.approx(0.75)
    middle = [0.625, 0.125, 0.125, 0.125]
    served = math.log2(1 / middle[0])
    expected = sum(0.25 * math.log2(0.25 / m) for m in middle)
    assert drift.jensen_shannon == pytest.approx(math.sqrt((served + expected) / 2))
    # Chi-square of (2, 0, 0, 0) against 0.5 each: 6 on 3 degrees of freedom.
    chi = 6.0
    p_value = math.erfc(math.sqrt(chi / 2)) + math.sqrt(2 * chi / math.pi) * math.exp(-chi / 2)
    assert drift.p_value == pytest.approx(p_value)


def test_images_like_the_training_data_show_no_shift() -> None:
    window = Window(REFERENCE, 100)
    window.add(np.stack([flat(64, 64, 64), flat(191, 191, 191)]), answered([0, 1]), 1.0)
    window.add(np.stack([flat(64, 64, 64), flat(191, 191, 191)]), answered([2, 3]), 2.0)
    drift = window.drift()
    assert max(drift.shift) < 0.01
    assert drift.total_variation == pytest.approx(0.0)
    assert drift.p_value == pytest.approx(1.0)


def test_the_window_keeps_its_last_images_within_its_seconds() -> None:
    window = Window(REFERENCE, 3)
    for at in range(5):
        window.add(flat(at, at, at)[None], answered([0]), float(at))
    assert window.drift().images == 3
    assert window.drift().first == 2.0
    window.trim(oldest=3.5)
    assert window.drift().images == 1
    window.trim(oldest=10.0)
    empty = window.drift()
    assert (empty.images, empty.served_mean, empty.total_variation) == (0, [], None)


def test_the_class_reference_is_the_training_splits_shares_where_recorded() -> None:
    info = DatasetInfo(
        "odd", ("a", "b", "c", "d"), 3, (2, 2), (0.5,) * 3, (0.25,) * 3, (5, 3, 2, 0)
    )
    reference = Reference.of(info)
    assert reference.distribution == pytest.approx((0.5, 0.3, 0.2, 0.0))
    assert reference.source == TRAINING_SPLIT
    record = info.to_record()
    del record["class_counts"]  # a checkpoint written before the counts were recorded
    old = Reference.of(DatasetInfo.from_record(record))
    assert (old.distribution, old.source) == ((0.25,) * 4, UNIFORM)
    window = Window(reference, 100)
    window.add(np.stack([flat(128, 128, 128)] * 10), answered([0] * 5 + [1] * 3 + [2] * 2), 1.0)
    drift = window.drift()
    assert drift.total_variation == pytest.approx(0.0)  # served as the training split
    assert drift.p_value == pytest.approx(1.0)
    window.add(flat(128, 128, 128)[None], answered([3]), 2.0)
    # A class the training split never held: no chi-square, its p-value is 0.
    assert window.drift().p_value == 0.0


def test_drift_turned_off_refuses_its_reads_naming_the_setting(local_settings: Settings) -> None:
    settings = local_settings.model_copy(update={"drift_enabled": False})
    monitor = DriftMonitor(settings, WatchMetrics(CollectorRegistry()), lambda _: None)
    asyncio.run(asyncio.wait_for(monitor.run(), 5))  # returns at once: nothing to fold
    with pytest.raises(ConflictError, match="DRIFT_ENABLED=true"):
        monitor.read("digits/1")


def served_batch(count: int, label: int = 0) -> Served:
    """An answered batch of `count` flat images of `digits/1`."""
    target = Resolved("digits/1", uuid.UUID(int=1), "digits", 1, "/nowhere", "e" * 64, 2)
    pixels = np.stack([flat(label, label, label)] * count)
    return Served(target, Caller(), pixels, answered([0] * count), 0.001)


def test_the_tap_notes_at_most_a_window_of_images_before_a_fold(
    local_settings: Settings,
) -> None:
    settings = local_settings.model_copy(update={"drift_window_images": 6})
    info = DatasetInfo("flat", ("a", "b", "c", "d"), 3, (2, 2), (0.5,) * 3, (0.25,) * 3)
    monitor = DriftMonitor(settings, WatchMetrics(CollectorRegistry()), lambda _: info)
    for _ in range(10):
        monitor.tap(served_batch(4))
    assert 6 <= monitor._noted_images["digits/1"] < 6 + 4
    drift = monitor.read("digits/1")
    assert drift is not None
    assert drift.images == 6
    assert drift.shift == pytest.approx([2.0] * 3)  # black against a mean of 0.5, std 0.25
    assert monitor.read("digits/2") is None


@pytest.fixture(scope="module")
def digits_job(settings: Settings) -> uuid.UUID:
    """ResNet-8 trained for two steps on scikit-learn's digits (8x8, one channel)."""
    return trained_job(settings, DIGITS)


def test_inverted_digits_raise_the_shift_and_its_gauge(
    settings: Settings, digits_job: uuid.UUID
) -> None:
    spec = TrainSpec.model_validate(DIGITS)
    data = load_dataset(spec.dataset, data_root=settings.data_dir)
    split, counts = data.test, data.info.class_counts
    assert isinstance(split, TensorSplit)
    assert counts is not None
    test = split.images[:32].numpy()
    shares = [count / sum(counts) for count in counts]
    plain = [images.encode(Image.fromarray(image[0], "L")) for image in test]
    inverted = [images.encode(Image.fromarray(255 - image[0], "L")) for image in test]

    async def serve(plane: DataPlane, pngs: list[bytes]) -> tuple[float, float]:
        """The channel's shift and served mean of `pngs`, in a window of their own."""
        registry = CollectorRegistry()
        monitor = DriftMonitor(
            settings,
            WatchMetrics(registry),
            lambda sha256: plane.models.peek(sha256).info,  # type: ignore[union-attr]
        )
        plane.taps[:] = [monitor.tap]
        for start in range(0, len(pngs), 16):
            files = files_of(*((f"{i}.png", png) for i, png in enumerate(pngs[start:][:16])))
            await plane.predict(str(digits_job), Caller(), files, status_of=status)
        drift = await asyncio.to_thread(monitor.read, str(digits_job))
        assert drift is not None
        assert drift.images == len(pngs)
        assert drift.reference is not None
        assert drift.reference.mean == pytest.approx((0.306,), abs=1e-3)
        assert drift.reference.source == TRAINING_SPLIT
        assert drift.reference.distribution == pytest.approx(shares)
        gauge = registry.get_sample_value(
            "resnet_model_drift_mean_shift", {"model": str(digits_job), "channel": "0"}
        )
        assert gauge == pytest.approx(drift.shift[0])
        return drift.shift[0], drift.served_mean[0]

    async def work() -> None:
        cache = ModelCache(options=ServingOptions(threads=1))
        plane = DataPlane(settings, cache, RefCache(), ModelMetrics(CollectorRegistry()))
        try:
            shift, mean = await serve(plane, plain)
            assert shift < 0.15  # the test split, as the training split
            inverted_shift, inverted_mean = await serve(plane, inverted)
        finally:
            await cache.close()
        assert inverted_mean == pytest.approx(1 - mean)
        assert inverted_shift > 0.8  # |0.69 - 0.31| / 0.38

    asyncio.run(work())

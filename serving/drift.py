"""Drift: what each served model was shown and answered lately, against its training data.

As KServe's drift detectors watch an inference service, the data plane's tap
(`DriftMonitor.tap`, on the event loop) notes each answered batch (a reference to its
images and probabilities) and returns; a worker thread folds what was noted into the
model's window, the last DRIFT_WINDOW_IMAGES images served within DRIFT_WINDOW_SECONDS,
once a second and before each read. Per image the window keeps its channels' means and
mean squares on the 0..1 scale and its predicted class, so the statistics are:

- per channel, the served mean and std (over every pixel of the window's images) and the
  shift |mean served - mean train| / std train, with the training split's mean and std the
  checkpoint records (`training.data.DatasetInfo`), and std served / std train;
- the predicted classes' distribution against the reference's: the training split's class
  shares where the checkpoint records its class counts, else (checkpoints written before
  they were recorded, imported weights) uniform over the classes; its total variation
  distance, Jensen-Shannon distance (base 2, 0..1) and the chi-square goodness-of-fit
  p-value (scipy).

With DRIFT_ENABLED=false the API installs no tap, `run` returns at once and `read` refuses.

The window is this process's: each API process watches the requests it served. The
statistics go to the Prometheus gauges of `serving.metrics.WatchMetrics` at each fold.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import numpy.typing as npt
from scipy.spatial.distance import jensenshannon  # type: ignore[import-untyped]
from scipy.stats import chisquare  # type: ignore[import-untyped]
from starlette.concurrency import run_in_threadpool

from core.errors import ConflictError
from core.settings import Settings
from serving.dataplane import Served, label_of
from serving.metrics import WatchMetrics
from serving.process import Images, Probabilities
from training.data import DatasetInfo

log = logging.getLogger(__name__)

FOLD_EVERY_S = 1.0  # how stale the gauges may be; reads fold first
ClassSource = Literal["uniform", "training_split"]  # where a reference's class shares come from
UNIFORM: ClassSource = "uniform"  # no class counts recorded: every class alike
TRAINING_SPLIT: ClassSource = "training_split"  # the training split's class counts
DRIFT_OFF = (
    "drift is turned off on this server; set DRIFT_ENABLED=true (the default) and restart "
    "the API to watch it"
)
Floats = npt.NDArray[np.float64]
InfoOf = Callable[[str], DatasetInfo | None]  # a loaded checkpoint's data, by sha256


@dataclass(frozen=True, slots=True)
class Reference:
    """The training data a model is held against: per channel mean and std (0..1 scale),
    the class names and the class distribution expected (and where it comes from)."""

    mean: tuple[float, ...]
    std: tuple[float, ...]
    classes: tuple[str, ...]
    distribution: tuple[float, ...]
    source: ClassSource

    @classmethod
    def of(cls, info: DatasetInfo) -> Reference:
        """The reference a checkpoint's data gives: its training split's class shares, or
        every class alike where it records no class counts."""
        counts = info.class_counts
        if counts is None or len(counts) != info.num_classes or sum(counts) <= 0:
            share = 1 / info.num_classes
            return cls(info.mean, info.std, info.classes, (share,) * info.num_classes, UNIFORM)
        shares = tuple(count / sum(counts) for count in counts)
        return cls(info.mean, info.std, info.classes, shares, TRAINING_SPLIT)


@dataclass(frozen=True, slots=True)
class Drift:
    """A window's statistics against its reference (None where the window is empty)."""

    images: int
    first: float | None  # `time.time()` of the window's oldest image
    last: float | None
    served_mean: list[float]
    served_std: list[float]
    shift: list[float]
    std_ratio: list[float]
    counts: list[int]
    total_variation: float | None
    jensen_shannon: float | None
    p_value: float | None
    reference: Reference | None


def statistics(
    means: Floats, squares: Floats, reference: Reference | None
) -> tuple[list[float], list[float], list[float], list[float]]:
    """Per channel: the served mean and std of `means`/`squares` (images x channels, each
    image's mean and mean square), the shift from the reference and the std ratio."""
    if not len(means):
        return [], [], [], []
    mean = means.mean(axis=0)
    std = np.sqrt(np.maximum(squares.mean(axis=0) - mean**2, 0.0))
    if reference is None:
        return mean.tolist(), std.tolist(), [], []
    train_mean, train_std = np.asarray(reference.mean), np.asarray(reference.std)
    shift = np.abs(mean - train_mean) / train_std
    return mean.tolist(), std.tolist(), shift.tolist(), (std / train_std).tolist()


def class_distance(
    counts: npt.NDArray[np.int64], expected: tuple[float, ...]
) -> tuple[float | None, float | None, float | None]:
    """Total variation and Jensen-Shannon distance of the classes counted from `expected`,
    and the chi-square goodness-of-fit p-value (None without counts or with one class)."""
    total = int(counts.sum())
    if total == 0:
        return None, None, None
    served, reference = counts / total, np.asarray(expected)
    variation = float(0.5 * np.abs(served - reference).sum())
    distance = float(jensenshannon(served, reference, base=2))
    return variation, distance, goodness_of_fit(counts, reference)


def goodness_of_fit(counts: npt.NDArray[np.int64], reference: Floats) -> float | None:
    """The chi-square p-value of `counts` against the shares `reference` (None with one
    possible class; 0 when a class the reference never holds was predicted)."""
    possible = reference > 0
    if counts[~possible].any():
        return 0.0
    if possible.sum() < 2:
        return None
    expected = reference[possible] * counts.sum()
    return float(chisquare(counts[possible], f_exp=expected).pvalue)


@dataclass(slots=True)
class Window:
    """A model's last `size` served images in a ring of arrays: per image its time,
    channel means, channel mean squares (0..1 scale) and predicted class. A batch is a
    few array operations, whatever its size; nothing is done per image in Python."""

    reference: Reference | None
    size: int
    times: Floats = field(init=False)
    means: Floats = field(init=False)
    squares: Floats = field(init=False)
    predicted: npt.NDArray[np.int64] = field(init=False)
    end: int = field(init=False, default=0)  # where the next image goes
    count: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self.times = np.zeros(self.size)
        self.means = self.squares = np.zeros((self.size, 0))
        self.predicted = np.zeros(self.size, dtype=np.int64)

    def add(self, images: Images, probabilities: Probabilities, at: float) -> None:
        """Note a batch's images and predicted classes."""
        images, probabilities = images[-self.size :], probabilities[-self.size :]
        flat = images.reshape(len(images), images.shape[1], -1)
        if self.means.shape[1] != flat.shape[1]:  # the first batch says the channels
            self.means = np.zeros((self.size, flat.shape[1]))
            self.squares = np.zeros((self.size, flat.shape[1]))
            self.count = 0
        # Integer sums: exact, and no float copy of every pixel.
        sums = flat.sum(axis=2, dtype=np.int64)
        squares = np.square(flat, dtype=np.uint16).sum(axis=2, dtype=np.int64)  # 255^2 fits
        slots = (self.end + np.arange(len(flat))) % self.size
        self.times[slots] = at
        self.means[slots] = sums / (flat.shape[2] * 255.0)
        self.squares[slots] = squares / (flat.shape[2] * 255.0 * 255.0)
        self.predicted[slots] = probabilities.argmax(axis=1)
        self.end = (self.end + len(flat)) % self.size
        self.count = min(self.size, self.count + len(flat))

    def _held(self) -> npt.NDArray[np.intp]:
        """The ring's positions of the images held, oldest first."""
        return (self.end - self.count + np.arange(self.count)) % self.size

    def trim(self, oldest: float) -> None:
        """Forget the images served before `oldest`."""
        self.count -= int(np.searchsorted(self.times[self._held()], oldest))

    def drift(self) -> Drift:
        """The window's statistics against its reference."""
        held = self._held()
        reference = self.reference
        means, squares, predicted = self.means[held], self.squares[held], self.predicted[held]
        times = self.times[held]
        mean, std, shift, ratio = statistics(means, squares, reference)
        classes = len(reference.classes) if reference is not None else 0
        counts = np.bincount(predicted, minlength=classes)
        variation, distance, p_value = (
            class_distance(counts, reference.distribution)
            if reference is not None and len(counts) == classes
            else (None, None, None)
        )
        return Drift(
            len(held),
            float(times[0]) if len(held) else None,
            float(times[-1]) if len(held) else None,
            mean,
            std,
            shift,
            ratio,
            counts.tolist(),
            variation,
            distance,
            p_value,
            reference,
        )


@dataclass(frozen=True, slots=True)
class Noted:
    """An answered batch as the tap noted it."""

    images: Images
    probabilities: Probabilities
    at: float
    info: DatasetInfo | None


class DriftMonitor:
    """Every served model's window and statistics: noted by the tap, folded by `run`."""

    def __init__(self, settings: Settings, metrics: WatchMetrics, info_of: InfoOf) -> None:
        self.settings, self.metrics, self.info_of = settings, metrics, info_of
        self.windows: dict[str, Window] = {}
        self._noted: dict[str, deque[Noted]] = {}
        self._noted_images: dict[str, int] = {}
        self._lock = threading.Lock()  # the noted batches: the tap adds, a fold takes
        self._folding = threading.Lock()  # one fold at a time
        self._stopping = False
        self._wake: asyncio.Event | None = None

    def tap(self, served: Served) -> None:
        """Note a batch for the next fold (never waits beyond the noted batches' lock)."""
        label = label_of(served.target)
        noted = Noted(
            served.images, served.probabilities, time.time(), self.info_of(served.target.sha256)
        )
        with self._lock:
            batches = self._noted.setdefault(label, deque())
            batches.append(noted)
            count = self._noted_images.get(label, 0) + len(served.images)
            # Older batches than a window's worth would only be pushed out of it again.
            while count - len(batches[0].images) >= self.settings.drift_window_images:
                count -= len(batches.popleft().images)
            self._noted_images[label] = count

    async def run(self) -> None:
        """Fold the noted batches once a second until `stop` (at once with drift off)."""
        if not self.settings.drift_enabled:
            return
        self._wake = asyncio.Event()
        while not self._stopping:
            try:
                await run_in_threadpool(self.fold)
            except Exception:  # what watches traffic never stops the server
                log.exception("the drift windows were not folded")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), FOLD_EVERY_S)

    def stop(self) -> None:
        """Have `run` return after its current fold."""
        self._stopping = True
        if self._wake is not None:
            self._wake.set()

    def fold(self) -> None:
        """Move the noted batches into their windows, forget what fell out of them, and
        set the gauges."""
        with self._folding:
            with self._lock:
                taken, self._noted, self._noted_images = self._noted, {}, {}
            for label, batches in taken.items():
                for noted in batches:
                    self._window(label, noted.info).add(noted.images, noted.probabilities, noted.at)
            oldest = time.time() - self.settings.drift_window_seconds
            for label, window in list(self.windows.items()):
                window.trim(oldest)
                self._export(label, window.drift())

    def read(self, label: str) -> Drift | None:
        """The statistics of a model's window now (None when it was not served here)."""
        if not self.settings.drift_enabled:
            raise ConflictError(DRIFT_OFF)
        self.fold()
        window = self.windows.get(label)
        return window.drift() if window is not None else None

    def _window(self, label: str, info: DatasetInfo | None) -> Window:
        """The model's window (made on its first batch), its reference from `info`."""
        window = self.windows.get(label)
        if window is None:
            reference = Reference.of(info) if info is not None else None
            window = Window(reference, self.settings.drift_window_images)
            self.windows[label] = window
        elif window.reference is None and info is not None:
            window.reference = Reference.of(info)
        return window

    def _export(self, label: str, drift: Drift) -> None:
        """The statistics as the model's gauges."""
        metrics = self.metrics
        metrics.window.labels(label).set(drift.images)
        for channel, (shift, ratio) in enumerate(zip(drift.shift, drift.std_ratio, strict=True)):
            metrics.mean_shift.labels(label, str(channel)).set(shift)
            metrics.std_ratio.labels(label, str(channel)).set(ratio)
        if drift.total_variation is not None:
            metrics.class_distance.labels(label).set(drift.total_variation)
        if drift.p_value is not None:
            metrics.class_p_value.labels(label).set(drift.p_value)

"""Where a run reports to: the CLI prints, the worker writes to Postgres, tests record."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from training.checkpoints import CheckpointInfo, Fence


class EventSink(Protocol):
    """Receives a run's metrics, log lines, checkpoints and progress; may ask it to stop.

    Its `fence`, when it has one, guards every checkpoint the run writes (the service's:
    an earlier attempt of a job writes nothing once a newer one took its folder).
    """

    @property
    def fence(self) -> Fence | None: ...

    def on_metrics(self, step: int, epoch: float, values: dict[str, float]) -> None: ...

    def on_event(self, level: str, message: str) -> None: ...

    def on_checkpoint(self, info: CheckpointInfo) -> None: ...

    def on_progress(self, step: int, total: int) -> None: ...

    def should_stop(self) -> bool: ...


@dataclass
class RecordingSink:
    """Keeps everything in memory (tests, notebooks); `stop_at` asks to stop at a step."""

    metrics: list[tuple[int, str, float]] = field(default_factory=list)
    events: list[tuple[str, str]] = field(default_factory=list)
    checkpoints: list[CheckpointInfo] = field(default_factory=list)
    stop_at: int | None = None
    step: int = 0
    fence: Fence | None = None

    def on_metrics(self, step: int, epoch: float, values: dict[str, float]) -> None:
        self.metrics.extend((step, name, value) for name, value in values.items())

    def on_event(self, level: str, message: str) -> None:
        self.events.append((level, message))

    def on_checkpoint(self, info: CheckpointInfo) -> None:
        self.checkpoints.append(info)

    def on_progress(self, step: int, total: int) -> None:
        self.step = step

    def should_stop(self) -> bool:
        return self.stop_at is not None and self.step >= self.stop_at

    def series(self, name: str) -> list[tuple[int, float]]:
        """(step, value) pairs of one metric."""
        return [(step, value) for step, n, value in self.metrics if n == name]


class NullSink:
    """Drops everything and never asks to stop: the sink of every rank but rank 0."""

    fence: Fence | None = None  # rank 0 writes the run's checkpoints

    def on_metrics(self, step: int, epoch: float, values: dict[str, float]) -> None:
        """Rank 0 reports the run's metrics."""

    def on_event(self, level: str, message: str) -> None:
        """Rank 0 reports the run's events."""

    def on_checkpoint(self, info: CheckpointInfo) -> None:
        """Rank 0 writes the run's checkpoints."""

    def on_progress(self, step: int, total: int) -> None:
        """Rank 0 reports progress."""

    def should_stop(self) -> bool:
        return False


class JsonlSink:
    """Appends metrics to `metrics.jsonl` and log lines to `events.log` in a run folder."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.fence: Fence | None = None  # a command's run folder is its own: unfenced
        self.metrics_path = directory / "metrics.jsonl"
        self.events_path = directory / "events.log"

    def on_metrics(self, step: int, epoch: float, values: dict[str, float]) -> None:
        record: dict[str, Any] = {"step": step, "epoch": round(epoch, 4), **values}
        with self.metrics_path.open("a") as f:
            f.write(json.dumps(record) + "\n")

    def on_event(self, level: str, message: str) -> None:
        with self.events_path.open("a") as f:
            f.write(f"{level.upper():7} {message}\n")

    def on_checkpoint(self, info: CheckpointInfo) -> None:
        with self.events_path.open("a") as f:
            f.write(f"INFO    checkpoint {info.path.name} sha256 {info.sha256}\n")

    def on_progress(self, step: int, total: int) -> None:
        """Progress lives in the metrics file already."""

    def should_stop(self) -> bool:
        return False

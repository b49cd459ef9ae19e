"""The command line's event sink: a progress bar over the run's JSONL files."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from training.events import JsonlSink


class ProgressSink(JsonlSink):
    """Writes metrics.jsonl / events.log like `JsonlSink` and shows a live progress bar."""

    def __init__(self, directory: Path, console: Console) -> None:
        super().__init__(directory)
        self.console = console
        self.progress = Progress(
            TextColumn("[bold]train"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[status]}"),
            TimeRemainingColumn(),
            console=console,
        )
        self.task = self.progress.add_task("train", total=None, status="")
        self.latest: dict[str, float] = {}

    def __enter__(self) -> ProgressSink:
        self.progress.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.progress.stop()

    def on_metrics(self, step: int, epoch: float, values: dict[str, float]) -> None:
        super().on_metrics(step, epoch, values)
        self.latest |= {k: v for k, v in values.items() if not k.startswith("diag/")}
        shown = ("train/loss", "train/error", "test/error", "lr")
        status = "  ".join(f"{k} {self.latest[k]:.4g}" for k in shown if k in self.latest)
        self.progress.update(self.task, status=status)

    def on_event(self, level: str, message: str) -> None:
        super().on_event(level, message)
        self.progress.console.log(message)

    def on_progress(self, step: int, total: int) -> None:
        self.progress.update(self.task, completed=step, total=total)

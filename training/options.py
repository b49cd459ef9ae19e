"""How a run trains, apart from what it trains: one object from the caller to the loop."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from training.checkpoints import FREE_MARGIN_BYTES
from training.data import LoadedDataset
from training.devices import default_device

# Each process's own: a rank trains on a device of its own, and only rank 0 prepares.
_OF_THE_PROCESS = ("device", "prepare")


@dataclass(frozen=True, kw_only=True)
class RunOptions:
    """Where a run reads and writes, on which device, and how it starts.

    `prepare` sees the loaded dataset before training starts (the service sets the job's
    time limits from it). A checkpoint is written only with its size plus `free_margin`
    bytes free on its disk. `resume` picks up from the run folder's latest verified
    checkpoint.
    """

    out_dir: Path
    data_root: Path = Path()  # where datasets are looked up (DATA_DIR); `fit` reads none
    device: torch.device | None = None  # None: `default_device()`
    download: bool = False
    resume: bool = True
    free_margin: int = FREE_MARGIN_BYTES
    prepare: Callable[[LoadedDataset], None] | None = None

    @property
    def train_device(self) -> torch.device:
        """The device to train on: the one given, else the default."""
        return self.device or default_device()

    def to_json(self) -> dict[str, Any]:
        """What another process of the run reads back with `from_json`."""
        record = {
            field.name: getattr(self, field.name)
            for field in dataclasses.fields(self)
            if field.name not in _OF_THE_PROCESS
        }
        return record | {"out_dir": str(self.out_dir), "data_root": str(self.data_root)}

    @classmethod
    def from_json(cls, record: dict[str, Any], device: torch.device) -> RunOptions:
        """The options of `to_json`, for a rank that trains on `device`."""
        paths = {"out_dir": Path(record["out_dir"]), "data_root": Path(record["data_root"])}
        return cls(**(record | paths), device=device)

"""The device a run, a worker or a command uses when none is named."""

from __future__ import annotations

import torch


def default_device() -> torch.device:
    """The first visible GPU, else the CPU."""
    return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")

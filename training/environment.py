"""What a run ran on: the service's version and commit, the libraries, the device, the host."""

from __future__ import annotations

import copy
import functools
import importlib.metadata
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import torch
import torchvision

_PACKAGE_DIR = Path(__file__).resolve().parent.parent
_GIT_TIMEOUT_S = 2.0


def environment(device: torch.device | None = None) -> dict[str, Any]:
    """The JSON-safe facts of the software and the device a run uses."""
    device = device if device is not None else torch.device("cpu")
    # a copy, so a caller that edits its record cannot change the cached facts
    return copy.deepcopy(
        {**_software(), "device": {"type": device.type, **_device(device.type, device.index)}}
    )


@functools.cache
def _software() -> dict[str, Any]:
    """The versions, read once per process: they cannot change under it."""
    return {
        "service": {"version": _service_version(), **_git()},
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "cuda": torch.version.cuda,
        "cudnn": _cudnn_version(),
        "os": platform.platform(),
        "host": platform.node(),
    }


def _service_version() -> str | None:
    """The installed distribution's version, or None when it is run from a bare tree."""
    try:
        return importlib.metadata.version("resnet-service")
    except importlib.metadata.PackageNotFoundError:
        return None


def _git() -> dict[str, Any]:
    """The checkout's commit and whether its tracked files differ from it; None outside one."""
    commit = _git_output("rev-parse", "HEAD")
    if commit is None:
        return {"commit": None, "dirty": None}
    status = _git_output("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": None if status is None else status != ""}


def _git_output(*args: str) -> str | None:
    """One git command's stripped output in the package's folder, or None when it fails."""
    try:
        done = subprocess.run(
            ["git", *args],
            cwd=_PACKAGE_DIR,
            capture_output=True,
            text=True,
            timeout=_GIT_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _cudnn_version() -> int | None:
    """cuDNN's version number, None on a build without it."""
    if not torch.backends.cudnn.is_available():
        return None
    version = torch.backends.cudnn.version()
    return int(version) if version is not None else None


@functools.cache
def _device(kind: str, index: int | None) -> dict[str, Any]:
    """The device's name and how many of its kind the host has."""
    if kind == "cuda" and torch.cuda.is_available():
        return {
            "name": torch.cuda.get_device_name(index),
            "count": torch.cuda.device_count(),
        }
    if kind == "mps":
        return {"name": "Apple MPS", "count": 1}
    return {"name": _cpu_model(), "count": _cpu_count()}


def _cpu_model() -> str | None:
    """The CPU's model name from /proc/cpuinfo, else what platform says, else None."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "Hardware"):
                return value.strip()
    except OSError:
        pass
    return platform.processor() or None


def _cpu_count() -> int:
    """The CPUs this process may run on (its affinity), which a container may narrow."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1

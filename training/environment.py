"""What a run ran on: the service's version and commit, the libraries, the device, the host."""

from __future__ import annotations

import functools
import importlib.metadata
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
    name, count = _device(device.type, device.index)
    return {**_software(), "device": name, "device_type": device.type, "device_count": count}


@functools.cache
def _software() -> dict[str, str | int | None]:
    """The versions, read once per process: they cannot change under it."""
    return {
        "service": _service_version(),
        "git_commit": _git_commit(),
        "python": platform.python_version(),
        "torch": str(torch.__version__),  # a TorchVersion, which weights-only loads refuse
        "torchvision": str(torchvision.__version__),
        "cuda": None if torch.version.cuda is None else str(torch.version.cuda),
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


def _git_commit() -> str | None:
    """The checkout's commit, "+dirty" when its tracked files differ from it; None outside one."""
    commit = _git_output("rev-parse", "HEAD")
    if commit is None:
        return None
    status = _git_output("status", "--porcelain", "--untracked-files=no")
    return commit + "+dirty" if status else commit


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
def _device(kind: str, index: int | None) -> tuple[str | None, int]:
    """The device's name and how many devices of its kind torch sees."""
    if kind == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_name(index), torch.cuda.device_count()
    if kind == "mps":
        return "Apple MPS", 1
    # torch sees the host's CPUs as one device
    return _cpu_model(), 1


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

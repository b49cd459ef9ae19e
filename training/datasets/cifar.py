"""CIFAR-10 and CIFAR-100 python archives: the .tar.gz, read in place, or its unpacked folder."""

from __future__ import annotations

import pickle
import tarfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np
import numpy.typing as npt
import torch

from training.data import TensorSplit
from training.datasets.common import Parts, download_with_torchvision, not_found, source_name
from training.datasets.digest import file_digest, files_digest


@dataclass(frozen=True)
class CifarFormat:
    """Where one CIFAR release keeps its batches, labels and class names."""

    archive: str
    folder: str
    train: tuple[str, ...]
    test: str
    meta: str
    labels: bytes
    names: bytes
    torchvision_class: str


FORMATS = {
    "cifar10": CifarFormat(
        "cifar-10-python.tar.gz",
        "cifar-10-batches-py",
        tuple(f"data_batch_{i}" for i in range(1, 6)),
        "test_batch",
        "batches.meta",
        b"labels",
        b"label_names",
        "CIFAR10",
    ),
    "cifar100": CifarFormat(
        "cifar-100-python.tar.gz",
        "cifar-100-python",
        ("train",),
        "test",
        "meta",
        b"fine_labels",
        b"fine_label_names",
        "CIFAR100",
    ),
}
# The globals that pickled numpy arrays need; unpickling anything else could run code.
_ARRAY_GLOBALS = {
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.numeric", "_frombuffer"),
    ("numpy._core.numeric", "_frombuffer"),
    ("_codecs", "encode"),
}


class _ArrayUnpickler(pickle.Unpickler):
    """An unpickler of plain data and numpy arrays only."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _ARRAY_GLOBALS:
            raise pickle.UnpicklingError(f"refusing to unpickle {module}.{name}")
        return super().find_class(module, name)


def _unpickle(file: IO[bytes], source: str) -> dict[bytes, Any]:
    """One CIFAR pickle (a dict with bytes keys); any failure names `source`."""
    try:
        loaded = _ArrayUnpickler(file, encoding="bytes").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError) as error:
        raise ValueError(f"cannot read CIFAR batch {source}: {error}") from error
    if not isinstance(loaded, dict):
        raise ValueError(f"CIFAR batch {source} is not a dict but a {type(loaded).__name__}")
    return loaded


def places(name: str, data_root: Path) -> list[Path]:
    """Where a CIFAR release is looked for: its folder, then its archive, in two roots."""
    fmt = FORMATS[name]
    return [
        root / file for root in (data_root, data_root / name) for file in (fmt.folder, fmt.archive)
    ]


def locate(name: str, data_root: Path) -> Path | None:
    """The first place that holds the release, if any."""
    return next((place for place in places(name, data_root) if place.exists()), None)


def hint(name: str, data_root: Path) -> str:
    """How to provide the release's files."""
    fmt = FORMATS[name]
    return f"put {fmt.archive} (or its unpacked {fmt.folder}/) in {data_root}"


def _read_folder(fmt: CifarFormat, folder: Path) -> dict[str, dict[bytes, Any]]:
    """Every pickle of the release, from its unpacked folder."""
    pickles = {}
    for name in (*fmt.train, fmt.test, fmt.meta):
        if not (folder / name).is_file():
            raise ValueError(f"CIFAR folder {folder} lacks the file {name}")
        with (folder / name).open("rb") as file:
            pickles[name] = _unpickle(file, str(folder / name))
    return pickles


def _read_archive(fmt: CifarFormat, archive: Path) -> dict[str, dict[bytes, Any]]:
    """Every pickle of the release, read from the tar.gz in one pass without unpacking it."""
    wanted = {f"{fmt.folder}/{name}": name for name in (*fmt.train, fmt.test, fmt.meta)}
    pickles = {}
    try:
        with tarfile.open(archive, "r:*") as tar:
            for member in tar:
                reader = tar.extractfile(member) if member.name in wanted else None
                if reader is not None:
                    pickles[wanted[member.name]] = _unpickle(reader, f"{archive}:{member.name}")
    except (OSError, EOFError, zlib.error, tarfile.TarError) as error:
        raise ValueError(f"cannot read CIFAR archive {archive}: {error}") from error
    if missing := [name for name in wanted.values() if name not in pickles]:
        raise ValueError(f"CIFAR archive {archive} lacks {', '.join(missing)}")
    return pickles


def _batch(pickled: dict[bytes, Any], fmt: CifarFormat, source: str) -> TensorSplit:
    """The images (N, 3, 32, 32) and labels of one batch, checked for shape."""
    data: npt.NDArray[np.uint8] = np.asarray(pickled.get(b"data", ()), dtype=np.uint8)
    labels = np.asarray(pickled.get(fmt.labels, ()), dtype=np.int64)
    if data.ndim != 2 or data.shape[1] != 3 * 32 * 32 or labels.shape != (len(data),):
        raise ValueError(
            f"CIFAR batch {source} holds data {data.shape} and labels {labels.shape}; "
            f"expected (N, 3072) and (N,)"
        )
    return TensorSplit(torch.from_numpy(data.reshape(-1, 3, 32, 32)), torch.from_numpy(labels))


def _concat(batches: list[TensorSplit]) -> TensorSplit:
    """One split of several batches."""
    images = torch.cat([batch.images for batch in batches])
    return TensorSplit(images, torch.cat([batch.labels for batch in batches]))


def _class_names(meta: dict[bytes, Any], fmt: CifarFormat, source: str) -> tuple[str, ...]:
    """The class names that the release's meta pickle lists."""
    names = meta.get(fmt.names)
    if not isinstance(names, list) or not all(isinstance(name, bytes) for name in names):
        raise ValueError(f"CIFAR meta {source} lacks the list {fmt.names!r}")
    return tuple(name.decode() for name in names)


def load(name: str, data_root: Path, *, download: bool) -> Parts:
    """Read CIFAR-10 or CIFAR-100 (`name`) from `data_root`, downloading it if allowed."""
    fmt = FORMATS[name]
    if locate(name, data_root) is None and download:
        download_with_torchvision(fmt.torchvision_class, data_root)
    location = locate(name, data_root)
    if location is None:
        raise not_found(
            name, places(name, data_root), f"{hint(name, data_root)}, or enable downloads"
        )
    read = _read_folder if location.is_dir() else _read_archive
    pickles = read(fmt, location)
    train = _concat([_batch(pickles[part], fmt, f"{location}/{part}") for part in fmt.train])
    test = _batch(pickles[fmt.test], fmt, f"{location}/{fmt.test}")
    classes = _class_names(pickles[fmt.meta], fmt, f"{location}/{fmt.meta}")
    source = source_name(location, data_root)
    return Parts(name, classes, 3, (32, 32), train, test, _digest(fmt, location, data_root), source)


def _digest(fmt: CifarFormat, location: Path, data_root: Path) -> str:
    """The digest of what was read: the archive, or the folder's batch and meta files."""
    if not location.is_dir():
        return file_digest(location, data_root=data_root)
    files = [location / name for name in (*fmt.train, fmt.test, fmt.meta)]
    return files_digest(location, files, data_root=data_root)

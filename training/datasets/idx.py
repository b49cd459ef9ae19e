"""MNIST and Fashion-MNIST: IDX files, gzipped or not, in torchvision's layout or a folder."""

from __future__ import annotations

import gzip
import zlib
from math import prod
from pathlib import Path

import numpy as np
import numpy.typing as npt
import torch

from training.data import TensorSplit
from training.datasets.common import Parts, download_with_torchvision, not_found, source_name
from training.datasets.digest import files_digest

# Where Debian's `dataset-fashion-mnist` package installs the files.
DEBIAN_FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")
FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
FOLDERS = {
    "mnist": ("MNIST/raw", "mnist"),
    "fashion_mnist": ("FashionMNIST/raw", "fashion_mnist", "fashion-mnist"),
}
TORCHVISION_CLASSES = {"mnist": "MNIST", "fashion_mnist": "FashionMNIST"}
CLASSES = {
    "mnist": tuple(str(digit) for digit in range(10)),
    "fashion_mnist": (
        "T-shirt/top",
        "Trouser",
        "Pullover",
        "Dress",
        "Coat",
        "Sandal",
        "Shirt",
        "Sneaker",
        "Bag",
        "Ankle boot",
    ),
}
# The IDX type codes (third magic byte) and their big-endian numpy types.
IDX_TYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def _read_bytes(path: Path) -> bytes:
    """A file's bytes, gunzipped when its name ends in .gz."""
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as file:
                return file.read()
        return path.read_bytes()
    except (OSError, EOFError, zlib.error) as error:
        raise ValueError(f"cannot read IDX file {path}: {error}") from error


def read_idx(path: Path) -> npt.NDArray[np.generic]:
    """An IDX file as a numpy array in native byte order, its header checked."""
    data = _read_bytes(path)
    if len(data) < 4 or data[:2] != b"\0\0" or data[2] not in IDX_TYPES:
        raise ValueError(f"{path} is not an IDX file: bad magic number {data[:4].hex()!r}")
    ndim, header = data[3], 4 + 4 * data[3]
    if len(data) < header:
        raise ValueError(f"IDX file {path} is truncated inside its header")
    dims = tuple(int(dim) for dim in np.frombuffer(data, ">u4", count=ndim, offset=4))
    dtype = np.dtype(IDX_TYPES[data[2]])
    if len(data) != header + prod(dims) * dtype.itemsize:
        raise ValueError(
            f"IDX file {path} holds {len(data) - header} data bytes; its header "
            f"promises {prod(dims) * dtype.itemsize} for shape {dims}"
        )
    array = np.frombuffer(data, dtype, offset=header).reshape(dims)
    return array.astype(dtype.newbyteorder("="))


def places(name: str, data_root: Path) -> list[Path]:
    """The folders looked in for a dataset's IDX files, in order."""
    system = [DEBIAN_FASHION_MNIST] if name == "fashion_mnist" else []
    return [data_root / folder for folder in FOLDERS[name]] + system


def _find_file(folder: Path, base: str) -> Path | None:
    """`base` in `folder`, plain or gzipped."""
    return next((p for p in (folder / base, folder / f"{base}.gz") if p.is_file()), None)


def _files(folder: Path) -> dict[str, Path] | None:
    """The four IDX files in `folder` by base name, if they are all there."""
    found = {base: _find_file(folder, base) for pair in FILES.values() for base in pair}
    files = {base: path for base, path in found.items() if path is not None}
    return files if len(files) == len(found) else None


def locate(name: str, data_root: Path) -> Path | None:
    """The first folder that holds all four IDX files, if any."""
    return next((folder for folder in places(name, data_root) if _files(folder)), None)


def hint(name: str, data_root: Path) -> str:
    """How to provide the dataset's files."""
    return f"put the four *-ubyte(.gz) files in {data_root / FOLDERS[name][1]}"


def _split(files: dict[str, Path], pair: tuple[str, str]) -> TensorSplit:
    """Images (N, 1, H, W) and labels from one pair of IDX files, checked for agreement."""
    images_path, labels_path = files[pair[0]], files[pair[1]]
    images, labels = read_idx(images_path), read_idx(labels_path)
    if images.dtype != np.uint8 or images.ndim != 3:
        raise ValueError(f"{images_path} holds {images.dtype} {images.shape}, not uint8 (N, H, W)")
    if labels.dtype != np.uint8 or labels.shape != (len(images),):
        raise ValueError(
            f"{labels_path} holds {labels.dtype} {labels.shape}, not {len(images)} uint8 labels"
        )
    return TensorSplit(torch.from_numpy(images[:, None]), torch.from_numpy(labels.astype(np.int64)))


def load(name: str, data_root: Path, *, download: bool) -> Parts:
    """Read MNIST or Fashion-MNIST (`name`), downloading it into `data_root` if allowed."""
    if locate(name, data_root) is None and download:
        download_with_torchvision(TORCHVISION_CLASSES[name], data_root)
    folder = locate(name, data_root)
    files = None if folder is None else _files(folder)
    if folder is None or files is None:
        raise not_found(
            name, places(name, data_root), f"{hint(name, data_root)}, or enable downloads"
        )
    train, test = _split(files, FILES["train"]), _split(files, FILES["test"])
    size = (train.images.shape[2], train.images.shape[3])
    digest = files_digest(folder, list(files.values()), data_root=data_root)
    source = source_name(folder, data_root)
    return Parts(name, CLASSES[name], 1, size, train, test, digest, source)

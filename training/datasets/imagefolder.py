"""ImageFolder trees (`class/image.ext`), as a folder or an archive under the data root."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from training.data import FileSplit, TensorSplit
from training.datasets.archives import (
    ARCHIVE_SUFFIXES,
    MAX_BYTES,
    MAX_ENTRIES,
    is_archive,
    unpack_archive,
)
from training.datasets.common import Parts, not_found, stratified_split, take
from training.datasets.images import GRAY_MODES, decode, is_image_name, open_image
from training.specs import ImageFolderSpec

# Above this many decoded bytes a dataset is read from its files during training.
MAX_IN_MEMORY_BYTES = 2 * 2**30
# Archives are unpacked into <data root>/.unpacked/<sha256 of the archive>/.
CACHE_FOLDER = ".unpacked"


def resolve_inside(data_root: Path, relative: str) -> Path:
    """`relative` under `data_root`, refusing anything that resolves (links too) outside it."""
    root = data_root.resolve()
    path = (root / relative).resolve()
    if not path.is_relative_to(root):
        raise ValueError(f"path {relative!r} resolves outside the data root {root}")
    return path


def _visible(path: Path) -> bool:
    """Whether a file or folder is neither hidden nor macOS's `__MACOSX` resource folder."""
    return not path.name.startswith(".") and path.name != "__MACOSX"


def _descend(tree: Path) -> Path:
    """The folder below any single wrapping folder (an archive of `mydata/cat/...`)."""
    children = [child for child in tree.iterdir() if _visible(child)]
    return _descend(children[0]) if len(children) == 1 and children[0].is_dir() else tree


def find_tree(spec: ImageFolderSpec, data_root: Path, *, max_entries: int, max_bytes: int) -> Path:
    """The folder holding the classes (or train/ and test/), unpacking an archive first."""
    source = resolve_inside(data_root, spec.path)
    if not source.exists():
        hint = f"upload a folder or a {'/'.join(ARCHIVE_SUFFIXES)} archive of class/image files"
        raise not_found("imagefolder", [source], f"{hint} to {data_root}")
    if source.is_dir():
        return _descend(source)
    if not is_archive(source):
        raise ValueError(f"{source} is neither a folder nor a {'/'.join(ARCHIVE_SUFFIXES)} archive")
    cache = data_root / CACHE_FOLDER
    return _descend(unpack_archive(source, cache, max_entries=max_entries, max_bytes=max_bytes))


def _class_names(folder: Path) -> tuple[str, ...]:
    """The sorted names of the class folders in `folder`."""
    names = tuple(
        sorted(child.name for child in folder.iterdir() if child.is_dir() and _visible(child))
    )
    if not names:
        raise ValueError(f"{folder} has no class folders; expected {folder}/<class>/<image>")
    return names


def _images_in(folder: Path) -> list[Path]:
    """The image files anywhere below `folder`, outside hidden folders, sorted."""
    found = (path for path in folder.rglob("*") if path.is_file() and is_image_name(path.name))
    return sorted(p for p in found if all(map(_visible, p.relative_to(folder).parents[:-1])))


def _listing(folder: Path, classes: tuple[str, ...]) -> FileSplit:
    """The image files under `folder/<class>/`, labelled by class."""
    paths: list[Path] = []
    labels: list[int] = []
    for label, name in enumerate(classes):
        found = _images_in(folder / name)
        paths += found
        labels += [label] * len(found)
    return FileSplit(tuple(paths), torch.tensor(labels, dtype=torch.int64))


def file_splits(tree: Path, spec: ImageFolderSpec) -> tuple[tuple[str, ...], FileSplit, FileSplit]:
    """Class names and the train and test files: train/ and test/ if both exist, else a split."""
    train_dir, test_dir = tree / "train", tree / "test"
    if train_dir.is_dir() and test_dir.is_dir():
        classes = _class_names(train_dir)
        if (test_classes := _class_names(test_dir)) != classes:
            raise ValueError(f"{test_dir} has classes {test_classes}; {train_dir} has {classes}")
        train, test = _listing(train_dir, classes), _listing(test_dir, classes)
    else:
        classes = _class_names(tree)
        everything = _listing(tree, classes)
        kept, held = stratified_split(everything.labels, spec.test_fraction, spec.split_seed)
        train, test = take(everything, kept), take(everything, held)
    present = set(train.labels.tolist())
    if empty := [name for label, name in enumerate(classes) if label not in present]:
        raise ValueError(f"no training images in the class folders {empty} of {tree}")
    return classes, train, test


def _first_size(split: FileSplit) -> tuple[int, int]:
    """The (height, width) of the split's first image."""
    with open_image(split.paths[0]) as image:
        return image.height, image.width


def _check_size(path: Path, actual: tuple[int, int], size: tuple[int, int]) -> None:
    """Refuse an image whose (height, width) differs from the dataset's."""
    if actual != size:
        raise ValueError(
            f"image {path} is {actual[0]}x{actual[1]} (HxW), the first image {size[0]}x{size[1]}; "
            "set image_size to resize them all"
        )


def _decode_all(split: FileSplit, size: tuple[int, int], resize: bool) -> tuple[TensorSplit, bool]:
    """Decode a file split to RGB uint8 (N, 3, H, W); also whether every image was gray."""
    images = np.empty((len(split), 3, *size), dtype=np.uint8)
    gray = True
    for index, path in enumerate(split.paths):
        with open_image(path) as image:
            actual, gray = (image.height, image.width), gray and image.mode in GRAY_MODES
            images[index] = decode(image, 3, size)
        if not resize:
            _check_size(path, actual, size)
    return TensorSplit(torch.from_numpy(images), split.labels), gray


def _all_gray(split: FileSplit, size: tuple[int, int], resize: bool) -> bool:
    """Whether every image of a file split is gray, checking sizes from the headers only."""
    gray = True
    for path in split.paths:
        with open_image(path) as image:
            actual, gray = (image.height, image.width), gray and image.mode in GRAY_MODES
        if not resize:
            _check_size(path, actual, size)
    return gray


def _fits_in_memory(in_memory: bool | None, count: int, size: tuple[int, int]) -> bool:
    """Whether to hold the decoded images in memory: as asked, else when they fit."""
    if in_memory is not None:
        return in_memory
    return count * 3 * size[0] * size[1] <= MAX_IN_MEMORY_BYTES


def _first_channel(split: TensorSplit, gray: bool) -> TensorSplit:
    """The split with only its first channel when the dataset is gray."""
    return TensorSplit(split.images[:, :1].clone(), split.labels) if gray else split


def load(
    spec: ImageFolderSpec,
    data_root: Path,
    *,
    max_entries: int = MAX_ENTRIES,
    max_bytes: int = MAX_BYTES,
) -> Parts:
    """Read an ImageFolder tree or archive: decoded in memory if it fits, else as files."""
    tree = find_tree(spec, data_root, max_entries=max_entries, max_bytes=max_bytes)
    classes, train, test = file_splits(tree, spec)
    resize = spec.image_size is not None
    size = (spec.image_size, spec.image_size) if spec.image_size else _first_size(train)
    if not _fits_in_memory(spec.in_memory, len(train) + len(test), size):
        gray = _all_gray(train, size, resize) and _all_gray(test, size, resize)
        return Parts(spec.name, classes, 1 if gray else 3, size, train, test)
    train_images, train_gray = _decode_all(train, size, resize)
    test_images, test_gray = _decode_all(test, size, resize)
    gray = train_gray and test_gray
    train_images, test_images = (
        _first_channel(train_images, gray),
        _first_channel(test_images, gray),
    )
    return Parts(spec.name, classes, 1 if gray else 3, size, train_images, test_images)

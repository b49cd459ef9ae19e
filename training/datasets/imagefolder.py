"""ImageFolder trees (`class/image.ext`), as a folder or an archive under the data root.

The top level decides the splits: train/ + val/ + test/ (val/ validates, test/ tests);
train/ + val/, ImageNet's layout (val/ is the test split, as the papers report ImageNet's
val as their test figures, and validation is held out of train/); train/ + test/;
otherwise the class folders themselves, a seeded test part held out of each class.

Every file is read before training starts: decoded whole when the images are held in
memory, else decoded cheaply (a JPEG at an eighth of its size, which still reads its whole
stream) on threads, so a corrupt file is named now, not hours into the run.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import numpy as np
import numpy.typing as npt
import torch

from training.data import FileSplit, Split, TensorSplit
from training.datasets.archives import (
    ARCHIVE_SUFFIXES,
    MAX_BYTES,
    MAX_ENTRIES,
    is_archive,
    unpack_archive,
)
from training.datasets.common import Parts, not_found, stratified_split, take
from training.datasets.digest import cached_file_digest, file_digest, files_digest
from training.datasets.images import GRAY_MODES, is_image_name, open_image, upright_size
from training.specs import ImageFolderSpec

if TYPE_CHECKING:
    from training.preprocess import Preprocessing

# Above this many decoded bytes a dataset is read from its files during training.
MAX_IN_MEMORY_BYTES = 2 * 2**30
# Archives are unpacked into <data root>/.unpacked/<sha256 of the archive>/.
CACHE_FOLDER = ".unpacked"
# Pillow releases the GIL while it decodes, so threads read files in parallel.
THREADS = min(32, os.cpu_count() or 1)
# Unreadable files quoted in the error of `bad_files: fail` (all are counted).
NAMED_IN_ERROR = 5
# The input of photos of many sizes when none is given: torchvision's ImageNet crop.
PHOTO_INPUT = 224
SPLITS = ("train", "val", "test")
T = TypeVar("T")
Facts = tuple[tuple[int, int], bool]  # an image's upright (height, width), and whether gray


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


def _source(spec: ImageFolderSpec, data_root: Path) -> Path:
    """The folder or archive that `spec.path` names, checked to exist and be one of them."""
    source = resolve_inside(data_root, spec.path)
    if not source.exists():
        hint = f"upload a folder or a {'/'.join(ARCHIVE_SUFFIXES)} archive of class/image files"
        raise not_found("imagefolder", [source], f"{hint} to {data_root}")
    if not source.is_dir() and not is_archive(source):
        raise ValueError(f"{source} is neither a folder nor a {'/'.join(ARCHIVE_SUFFIXES)} archive")
    return source


def find_tree(spec: ImageFolderSpec, data_root: Path, *, max_entries: int, max_bytes: int) -> Path:
    """The folder holding the classes (or train/ and test/), unpacking an archive first."""
    source = _source(spec, data_root)
    if source.is_dir():
        return _descend(source)
    # The archive's cached digest names its unpacked folder: a reload reads it no more. It
    # is cached only once the archive unpacked, so a refused one leaves nothing behind.
    known = cached_file_digest(source, data_root=data_root)
    cache = data_root / CACHE_FOLDER
    unpacked = unpack_archive(
        source,
        cache,
        max_entries=max_entries,
        max_bytes=max_bytes,
        sha256=known and known.removeprefix("sha256:"),
    )
    file_digest(source, data_root=data_root, known=f"sha256:{unpacked.name}")
    return _descend(unpacked)


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


@dataclass(frozen=True)
class Layout:
    """The class names and the files of each split a tree holds (`val` only if it has one)."""

    classes: tuple[str, ...]
    train: FileSplit
    val: FileSplit | None
    test: FileSplit

    def splits(self) -> dict[str, FileSplit]:
        """The splits there are, by name."""
        named = {"train": self.train, "val": self.val, "test": self.test}
        return {name: split for name, split in named.items() if split is not None}


def _subtree_splits(tree: Path, present: list[str]) -> Layout:
    """The splits of a tree with train/ and val/ or test/, whose class folders must agree."""
    train_dir = tree / "train"
    classes = _class_names(train_dir)
    listed = {}
    for name in present:
        if (found := _class_names(tree / name)) != classes:
            raise ValueError(f"{tree / name} has classes {found}; {train_dir} has {classes}")
        listed[name] = _listing(tree / name, classes)
    if "test" in listed:
        return Layout(classes, listed["train"], listed.get("val"), listed["test"])
    return Layout(classes, listed["train"], None, listed["val"])  # ImageNet's val/ is its test


def file_splits(tree: Path, spec: ImageFolderSpec) -> Layout:
    """Class names and the files of each split, as the tree's top level lays them out."""
    present = [name for name in SPLITS if (tree / name).is_dir()]
    if "train" in present and len(present) > 1:
        return _subtree_splits(tree, present)
    classes = _class_names(tree)
    everything = _listing(tree, classes)
    kept, held = stratified_split(everything.labels, spec.test_fraction, spec.split_seed)
    return Layout(classes, take(everything, kept), None, take(everything, held))


def _check_trained(classes: tuple[str, ...], train: Split, tree: Path) -> None:
    """Refuse a class without training images."""
    present = set(train.labels.tolist())
    if empty := [name for label, name in enumerate(classes) if label not in present]:
        raise ValueError(f"no training images in the class folders {empty} of {tree}")


def _on_threads(
    paths: Sequence[Path], work: Callable[[int, Path], T]
) -> tuple[list[T | None], list[tuple[Path, str]]]:
    """`work(index, path)` for every file on threads: the results (None where the file could
    not be read) and (path, error) of each such file, in order."""

    def guarded(item: tuple[int, Path]) -> tuple[T | None, str | None]:
        try:
            return work(*item), None
        except ValueError as error:  # open_image's: the file cannot be decoded
            return None, str(error.__cause__ or error)

    with ThreadPoolExecutor(THREADS) as pool:
        outcomes = list(pool.map(guarded, enumerate(paths)))
    bad = [(path, error) for path, (_, error) in zip(paths, outcomes, strict=True) if error]
    return [result for result, _ in outcomes], bad


def _decoder(
    images: npt.NDArray[np.uint8], geometry: Preprocessing
) -> Callable[[int, Path], Facts]:
    """Work that decodes file `index` into `images[index]` (RGB, the shorter side resized
    and the centre cropped as the run's preprocessing declares) and says what it was."""

    def work(index: int, path: Path) -> Facts:
        with open_image(path) as image:
            facts = upright_size(image), image.mode in GRAY_MODES
            images[index] = geometry.image(image)
        return facts

    return work


def _check_file(index: int, path: Path) -> Facts:
    """Decode a file cheaply to prove it readable: a JPEG at an eighth of its sides, which
    still reads every byte of its stream (a truncated one fails); other formats whole."""
    with open_image(path) as image:
        facts = upright_size(image), image.mode in GRAY_MODES
        image.draft(image.mode, (max(1, image.width // 8), max(1, image.height // 8)))
        image.load()
    return facts


@dataclass(frozen=True)
class _Read:
    """One split once read: the facts of each file (None: unreadable), the unreadable files
    with their errors, and its decoded RGB images when held in memory."""

    split: FileSplit
    facts: list[Facts | None]
    bad: list[tuple[Path, str]]
    images: npt.NDArray[np.uint8] | None


def _read(split: FileSplit, geometry: Preprocessing, in_memory: bool) -> _Read:
    """Read every file of a split: decoded into memory, or checked in place."""
    if not in_memory:
        return _Read(split, *_on_threads(split.paths, _check_file), None)
    images = np.empty((len(split), 3, *geometry.crop), dtype=np.uint8)
    return _Read(split, *_on_threads(split.paths, _decoder(images, geometry)), images)


def _unreadable(bad: list[tuple[Path, str]], total: int, tree: Path) -> ValueError:
    """The error naming the first unreadable files and counting them all."""
    named = "; ".join(f"cannot read image {path}: {error}" for path, error in bad[:NAMED_IN_ERROR])
    more = f"; and {len(bad) - NAMED_IN_ERROR} more" if len(bad) > NAMED_IN_ERROR else ""
    return ValueError(
        f"{len(bad)} of {total} images under {tree} cannot be read (bad_files 'skip' "
        f"leaves them out): {named}{more}"
    )


def _kept(read: _Read, gray: bool) -> Split:
    """The split without its unreadable files: in memory (one channel if gray) or as files."""
    keep = [index for index, facts in enumerate(read.facts) if facts is not None]
    labels = read.split.labels[keep]
    if read.images is None:
        return FileSplit(tuple(read.split.paths[index] for index in keep), labels)
    images = read.images[keep, :1] if gray else read.images[keep]
    return TensorSplit(torch.from_numpy(np.ascontiguousarray(images)), labels)


def _named(path: Path, error: str, tree: Path) -> tuple[str, str]:
    """A skipped file and its error, both naming it relative to the tree."""
    relative = path.relative_to(tree).as_posix()
    return relative, error.replace(str(path), relative)


def _fits_in_memory(in_memory: bool | None, count: int, size: tuple[int, int]) -> bool:
    """Whether to hold the decoded images in memory: as asked, else when they fit."""
    if in_memory is not None:
        return in_memory
    return count * 3 * size[0] * size[1] <= MAX_IN_MEMORY_BYTES


def _digest(spec: ImageFolderSpec, data_root: Path, tree: Path, layout: Layout) -> str:
    """The archive's digest, or the tree's over every image file of its splits."""
    source = _source(spec, data_root)
    if not source.is_dir():
        return file_digest(source, data_root=data_root)
    files = [path for split in layout.splits().values() for path in split.paths]
    return files_digest(tree, files, data_root=data_root)


def _read_all(
    spec: ImageFolderSpec, layout: Layout, size: tuple[int, int], tree: Path
) -> tuple[dict[str, _Read], list[tuple[Path, str]]]:
    """Every split read, and the unreadable files (refused unless skipped)."""
    total = sum(len(split) for split in layout.splits().values())
    in_memory = _fits_in_memory(spec.in_memory, total, size)
    # Imported here: training.preprocess imports this package (its images module) first.
    from training.preprocess import Preprocessing

    geometry = Preprocessing.for_decoding(size, spec.resize, 3)
    reads = {name: _read(split, geometry, in_memory) for name, split in layout.splits().items()}
    bad = [item for read in reads.values() for item in read.bad]
    if bad and spec.bad_files == "fail":
        raise _unreadable(bad, total, tree)
    return reads, bad


def _input_size(spec: ImageFolderSpec, layout: Layout) -> tuple[int, int]:
    """The net's input: as given; else the images' (height, width) when they all share one
    (read from their headers), else torchvision's 224 for photos of many sizes."""
    if spec.image_size:
        return spec.image_size, spec.image_size
    paths = [path for split in layout.splits().values() for path in split.paths]
    sizes, _ = _on_threads(paths, _header_size)  # unreadable files are named when read
    found = {size for size in sizes if size is not None}
    if len(found) == 1:
        return found.pop()
    if not found:
        raise ValueError(f"none of the {len(paths)} images can be read")
    return PHOTO_INPUT, PHOTO_INPUT


def _header_size(_index: int, path: Path) -> tuple[int, int]:
    """An image's upright (height, width), from its header."""
    with open_image(path) as image:
        return upright_size(image)


def load(
    spec: ImageFolderSpec,
    data_root: Path,
    *,
    max_entries: int = MAX_ENTRIES,
    max_bytes: int = MAX_BYTES,
) -> Parts:
    """Read an ImageFolder tree or archive: decoded in memory if it fits, else as files."""
    tree = find_tree(spec, data_root, max_entries=max_entries, max_bytes=max_bytes)
    layout = file_splits(tree, spec)
    digest = _digest(spec, data_root, tree, layout)
    size = _input_size(spec, layout)
    reads, bad = _read_all(spec, layout, size, tree)
    gray = all(f[1] for read in reads.values() for f in read.facts if f is not None)
    splits = {name: _kept(read, gray) for name, read in reads.items()}
    _check_trained(layout.classes, splits["train"], tree)
    skipped = tuple(_named(path, error, tree) for path, error in bad)
    return Parts(
        spec.name,
        layout.classes,
        1 if gray else 3,
        size,
        splits["train"],
        splits["test"],
        digest,
        Path(spec.path).as_posix(),
        splits.get("val"),
        skipped,
    )

"""Unpacking uploaded .zip/.tar/.tar.gz archives of image trees, safely, into a cache.

An archive is checked whole before anything is written: absolute paths, `..`, links and
devices, too many entries or too many bytes are refused. Its images are unpacked into a
temporary folder that is renamed into place, so a failure leaves nothing half-written.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import stat
import tarfile
import tempfile
import zipfile
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import IO

from training.datasets.images import is_image_name

ARCHIVE_SUFFIXES = (".zip", ".tar", ".tar.gz", ".tgz")
MAX_ENTRIES = 200_000
MAX_BYTES = 4 * 2**30  # total uncompressed size of the archive's files
# What a damaged, encrypted or oddly compressed archive raises while being read, and
# ValueError from the safety checks; either way the archive is refused.
_FAILURES = (
    ValueError,
    OSError,
    EOFError,
    zlib.error,
    zipfile.BadZipFile,
    tarfile.TarError,
    RuntimeError,
    NotImplementedError,
)


@dataclass(frozen=True)
class Entry:
    """One archive member: its checked path parts, size, kind and how to read it."""

    parts: tuple[str, ...]
    size: int
    is_file: bool
    opener: Callable[[], IO[bytes]]


def is_archive(path: Path) -> bool:
    """Whether `path` has one of the archive suffixes this module unpacks."""
    return path.name.lower().endswith(ARCHIVE_SUFFIXES)


def safe_parts(name: str) -> tuple[str, ...]:
    """The path parts of an archive entry, refusing absolute paths and `..`."""
    posix = name.replace("\\", "/")
    if posix.startswith("/") or re.match(r"[A-Za-z]:", posix):
        raise ValueError(f"archive entry {name!r} has an absolute path")
    parts = tuple(part for part in posix.split("/") if part not in ("", "."))
    if ".." in parts:
        raise ValueError(f"archive entry {name!r} has a '..' component")
    return parts


def _zip_entries(archive: zipfile.ZipFile) -> Iterator[Entry]:
    """The entries of a zip file, refusing links and devices."""
    for info in archive.infolist():
        kind = stat.S_IFMT(info.external_attr >> 16)
        if kind not in (0, stat.S_IFREG, stat.S_IFDIR):  # 0: written without Unix modes
            raise ValueError(f"archive entry {info.filename!r} is a link or device")
        is_file = not info.is_dir() and kind != stat.S_IFDIR
        opener = partial(archive.open, info)
        yield Entry(safe_parts(info.filename), info.file_size, is_file, opener)


def _tar_opener(archive: tarfile.TarFile, member: tarfile.TarInfo) -> IO[bytes]:
    """A reader of a regular tar member."""
    reader = archive.extractfile(member)
    assert reader is not None, "regular members always have data"
    return reader


def _tar_entries(archive: tarfile.TarFile) -> Iterator[Entry]:
    """The entries of a tar file, refusing links and devices."""
    for member in archive:
        if not (member.isfile() or member.isdir()):
            raise ValueError(f"archive entry {member.name!r} is a link or device")
        opener = partial(_tar_opener, archive, member)
        yield Entry(safe_parts(member.name), member.size, member.isfile(), opener)


@contextmanager
def _entries(path: Path) -> Iterator[Iterator[Entry]]:
    """The entries of the zip or tar archive at `path`, while it is open."""
    if path.name.lower().endswith(".zip"):
        with zipfile.ZipFile(path) as archive:
            yield _zip_entries(archive)
    else:
        with tarfile.open(path, "r:*") as archive:
            yield _tar_entries(archive)


def checked_images(entries: Iterator[Entry], max_entries: int, max_bytes: int) -> list[Entry]:
    """The image files among `entries`, once every entry has passed the safety checks."""
    images, total = [], 0
    for count, entry in enumerate(entries, start=1):
        name = "/".join(entry.parts)
        if count > max_entries:
            raise ValueError(f"archive has more than {max_entries} entries (at {name!r})")
        total += entry.size
        if total > max_bytes:
            raise ValueError(f"archive unpacks to more than {max_bytes} bytes (at {name!r})")
        if entry.is_file and _wanted(entry.parts):
            images.append(entry)
    return images


def _wanted(parts: tuple[str, ...]) -> bool:
    """Whether a file is an image outside hidden folders (such as macOS's `__MACOSX/`)."""
    hidden = any(part.startswith(".") or part == "__MACOSX" for part in parts)
    return bool(parts) and not hidden and is_image_name(parts[-1])


def _write(images: list[Entry], folder: Path) -> None:
    """Copy the checked image entries into `folder`."""
    for entry in images:
        target = folder.joinpath(*entry.parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        with entry.opener() as source, target.open("wb") as sink:
            shutil.copyfileobj(source, sink)


def sha256_of(path: Path) -> str:
    """The hex sha256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(partial(file.read, 2**20), b""):
            digest.update(block)
    return digest.hexdigest()


def unpack_archive(
    path: Path, cache: Path, *, max_entries: int = MAX_ENTRIES, max_bytes: int = MAX_BYTES
) -> Path:
    """Unpack the images of an archive into `cache/<sha256>/` (reused if there) and return it."""
    target = cache / sha256_of(path)
    if target.is_dir():
        return target
    try:
        with _entries(path) as entries:
            images = checked_images(entries, max_entries, max_bytes)
            cache.mkdir(parents=True, exist_ok=True)
            scratch = Path(tempfile.mkdtemp(prefix=".partial-", dir=cache))
            try:
                _write(images, scratch)
                scratch.rename(target)
            finally:
                shutil.rmtree(scratch, ignore_errors=True)  # gone once renamed
    except _FAILURES as error:
        if target.is_dir():  # another process unpacked the same archive first
            return target
        raise ValueError(f"cannot unpack archive {path}: {error}") from error
    return target

"""Unpacking uploaded .zip/.tar/.tar.gz archives of image trees, safely, into a cache.

An archive is checked whole before anything is written: absolute paths, `..`, links and
devices, too many entries, too many bytes or too high a compression ratio (a zip bomb) are
refused, and the bytes written are counted again while unpacking. Its images are unpacked
into a temporary folder that is renamed into place, so a failure leaves nothing behind.
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
# Unpacked bytes per archive byte. Images are compressed already (PNG, JPEG, WebP), so a
# dataset's archive unpacks to about its own size; a zip bomb to thousands of times it.
MAX_RATIO = 100.0
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


class ArchiveLimitError(ValueError):
    """An archive over an unpacking limit: its unpacked size, its ratio, or the room left."""


@dataclass(frozen=True)
class Limits:
    """What one archive may unpack to; `room` is what its owner's quota has left, if bounded."""

    max_entries: int = MAX_ENTRIES
    max_bytes: int = MAX_BYTES
    max_ratio: float = MAX_RATIO
    room: int | None = None


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


def checked_images(entries: Iterator[Entry], limits: Limits, packed: int) -> list[Entry]:
    """The image files among `entries`, once every entry has passed the safety checks.

    `packed` is the archive's own size in bytes, against which its ratio is measured.
    """
    images, total = [], 0
    for count, entry in enumerate(entries, start=1):
        name = "/".join(entry.parts)
        if count > limits.max_entries:
            raise ArchiveLimitError(
                f"archive has more than {limits.max_entries} entries (at {name!r})"
            )
        total += entry.size
        _check_total(total, limits, packed, at=name)
        if entry.is_file and _wanted(entry.parts):
            images.append(entry)
    return images


def _check_total(total: int, limits: Limits, packed: int, *, at: str) -> None:
    """Refuse `total` unpacked bytes over the size limit, the ratio limit or the room left."""
    if total > limits.max_bytes:
        raise ArchiveLimitError(
            f"archive unpacks to more than {limits.max_bytes} bytes (at {at!r})"
        )
    if total > limits.max_ratio * max(packed, 1):
        raise ArchiveLimitError(
            f"archive unpacks to more than {limits.max_ratio:g} times its {packed} bytes "
            f"(at {at!r}): the compression ratio limit, which zip bombs exceed"
        )
    if limits.room is not None and total > limits.room:
        raise ArchiveLimitError(
            f"archive unpacks to more than the {max(limits.room, 0)} bytes left of the "
            f"upload quota (at {at!r})"
        )


def _wanted(parts: tuple[str, ...]) -> bool:
    """Whether a file is an image outside hidden folders (such as macOS's `__MACOSX/`)."""
    hidden = any(part.startswith(".") or part == "__MACOSX" for part in parts)
    return bool(parts) and not hidden and is_image_name(parts[-1])


def _write(images: list[Entry], folder: Path, limits: Limits, packed: int) -> None:
    """Copy the checked image entries into `folder`, counting the bytes actually written."""
    written = 0
    for entry in images:
        target = folder.joinpath(*entry.parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        with entry.opener() as source, target.open("wb") as sink:
            for block in iter(partial(source.read, 2**20), b""):
                written += len(block)
                _check_total(written, limits, packed, at="/".join(entry.parts))
                sink.write(block)


def sha256_of(path: Path) -> str:
    """The hex sha256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(partial(file.read, 2**20), b""):
            digest.update(block)
    return digest.hexdigest()


def unpack_archive(
    path: Path,
    cache: Path,
    *,
    max_entries: int = MAX_ENTRIES,
    max_bytes: int = MAX_BYTES,
    limits: Limits | None = None,
    sha256: str | None = None,
) -> Path:
    """Unpack the images of an archive into `cache/<sha256>/` (reused if there) and return it.

    `limits` (default: `max_entries` and `max_bytes` with the default ratio) bound what it
    may unpack to; over one, `ArchiveLimitError` and nothing written. `sha256`, when the
    caller knows it already, saves reading the archive to find its folder.
    """
    limits = limits or Limits(max_entries=max_entries, max_bytes=max_bytes)
    target = cache / (sha256 or sha256_of(path))
    if target.is_dir():
        return target
    packed = path.stat().st_size
    try:
        with _entries(path) as entries:
            images = checked_images(entries, limits, packed)
            cache.mkdir(parents=True, exist_ok=True)
            scratch = Path(tempfile.mkdtemp(prefix=".partial-", dir=cache))
            try:
                _write(images, scratch, limits, packed)
                scratch.rename(target)
            finally:
                shutil.rmtree(scratch, ignore_errors=True)  # gone once renamed
    except _FAILURES as error:
        if target.is_dir():  # another process unpacked the same archive first
            return target
        kind = ArchiveLimitError if isinstance(error, ArchiveLimitError) else ValueError
        raise kind(f"cannot unpack archive {path}: {error}") from error
    return target

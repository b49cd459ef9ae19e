"""Unpacking uploaded .zip/.tar/.tar.gz archives of image trees, safely, into a cache.

An archive is checked whole before anything is written: absolute paths, `..`, links and
devices, too many entries, too many bytes or too high a compression ratio (a zip bomb) are
refused, and the bytes written are counted again while unpacking. Its index is bounded as it
is read: a zip's entry count is taken from its end record and central directory before
`zipfile` loads them, a tar's headers one at a time, each extended header bounded in size.
Its images are unpacked into a temporary folder that is renamed into place, so a failure
leaves nothing behind.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import stat
import struct
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
# Most bytes of a tar member's long name or pax attributes: names are at most a few KiB.
MAX_HEADER_BYTES = 64 * 2**10
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
    """An archive over an unpacking limit: its entries, unpacked size, ratio, or the room left."""


@dataclass(frozen=True)
class Limits:
    """What one archive may unpack to; `room` is what its owner's quota has left, if bounded."""

    max_entries: int = MAX_ENTRIES
    max_bytes: int = MAX_BYTES
    max_ratio: float = MAX_RATIO
    room: int | None = None  # disk bytes: whole blocks of the files and their folders
    room_files: int | None = None
    block: int = 4096  # the file system's block size, to which each file and folder rounds


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


def check_zip_index(path: Path, max_entries: int) -> None:
    """Refuse a zip whose central directory lists more than `max_entries` entries, read from
    its end record and counted header by header before `zipfile` loads the directory whole."""
    with path.open("rb") as file:
        end = zipfile._EndRecData(file)  # type: ignore[attr-defined]  # stdlib's own reader
        if end is None:
            raise zipfile.BadZipFile("no end of central directory record: not a zip file")
        entries, size = end[zipfile._ECD_ENTRIES_TOTAL], end[zipfile._ECD_SIZE]  # type: ignore[attr-defined]
        if entries > max_entries:
            raise ArchiveLimitError(f"archive has {entries} entries, more than {max_entries}")
        # The directory ends where the end records begin; its size decides how far zipfile
        # reads, whatever the count says, so count what it holds.
        start = end[zipfile._ECD_LOCATION] - size  # type: ignore[attr-defined]
        if end[zipfile._ECD_SIGNATURE] == zipfile.stringEndArchive64:  # type: ignore[attr-defined]
            start -= zipfile.sizeEndCentDir64 + zipfile.sizeEndCentDir64Locator  # type: ignore[attr-defined]
        file.seek(max(start, 0))
        _count_headers(file, size, max_entries)


def _count_headers(file: IO[bytes], size: int, max_entries: int) -> None:
    """Walk `size` bytes of central directory headers, refusing more than `max_entries`."""
    walked, count = 0, 0
    while walked < size:
        header = file.read(_CD_HEADER.size)
        if len(header) != _CD_HEADER.size:
            raise zipfile.BadZipFile("truncated central directory")
        signature, name, extra, comment = _CD_HEADER.unpack(header)
        if signature != b"PK\x01\x02":
            raise zipfile.BadZipFile("bad magic number for central directory")
        count += 1
        if count > max_entries:
            raise ArchiveLimitError(f"archive has more than {max_entries} entries")
        file.seek(name + extra + comment, 1)
        walked += _CD_HEADER.size + name + extra + comment


# A central directory header: its signature and the lengths of the name, extra field and
# comment that follow its 46 bytes (the rest is skipped).
_CD_HEADER = struct.Struct("<4s24x3H12x")


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


class _BoundedTarInfo(tarfile.TarInfo):
    """A tar header whose long-name or pax extension is refused past `MAX_HEADER_BYTES`
    before tarfile reads it into memory."""

    def _proc_member(self, tarfile_: tarfile.TarFile) -> tarfile.TarInfo:
        if self.type in _EXTENDED and self.size > MAX_HEADER_BYTES:
            raise ArchiveLimitError(
                f"archive has a {self.size}-byte extended header (long name or pax "
                f"attributes), more than {MAX_HEADER_BYTES}"
            )
        return super()._proc_member(tarfile_)  # type: ignore[misc,no-any-return]


_EXTENDED = (
    tarfile.GNUTYPE_LONGNAME,
    tarfile.GNUTYPE_LONGLINK,
    tarfile.XHDTYPE,
    tarfile.XGLTYPE,
    tarfile.SOLARIS_XHDTYPE,
)


def _tar_entries(archive: tarfile.TarFile) -> Iterator[Entry]:
    """The entries of a tar file, read one header at a time, refusing links and devices."""
    while (member := archive.next()) is not None:
        # tarfile keeps every header read; the entries hold theirs.
        archive.members.clear()  # type: ignore[attr-defined]
        if not (member.isfile() or member.isdir()):
            raise ValueError(f"archive entry {member.name!r} is a link or device")
        opener = partial(_tar_opener, archive, member)
        yield Entry(safe_parts(member.name), member.size, member.isfile(), opener)


@contextmanager
def _entries(path: Path, limits: Limits) -> Iterator[Iterator[Entry]]:
    """The entries of the zip or tar archive at `path`, while it is open."""
    if path.name.lower().endswith(".zip"):
        check_zip_index(path, limits.max_entries)
        with zipfile.ZipFile(path) as archive:
            yield _zip_entries(archive)
    else:
        with tarfile.open(path, "r:*", tarinfo=_BoundedTarInfo) as archive:
            yield _tar_entries(archive)


def checked_images(entries: Iterator[Entry], limits: Limits, packed: int) -> list[Entry]:
    """The image files among `entries`, once every entry has passed the safety checks.

    `packed` is the archive's own size in bytes, against which its ratio is measured.
    """
    images: list[Entry] = []
    total, disk = 0, limits.block  # the unpacked tree's own folder
    folders: set[tuple[str, ...]] = {()}
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
            new = {entry.parts[:end] for end in range(1, len(entry.parts))} - folders
            folders |= new
            disk += _blocks(entry.size, limits.block) + len(new) * limits.block
            _check_room(disk, len(images), limits, at=name)
    return images


def _blocks(size: int, block: int) -> int:
    """The bytes a file of `size` bytes takes on disk: whole blocks."""
    return -(-size // block) * block


def _check_room(disk: int, files: int, limits: Limits, *, at: str) -> None:
    """Refuse unpacking to more disk bytes or files than the owner's quota has left."""
    if limits.room is not None and disk > limits.room:
        raise ArchiveLimitError(
            f"archive unpacks to {disk} bytes on disk (whole {limits.block}-byte blocks, "
            f"folders included), more than the {max(limits.room, 0)} bytes left of the "
            f"upload quota (at {at!r})"
        )
    if limits.room_files is not None and files > limits.room_files:
        raise ArchiveLimitError(
            f"archive unpacks to more than the {max(limits.room_files, 0)} files left of "
            f"the upload file quota (at {at!r})"
        )


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
        with _entries(path, limits) as entries:
            images = checked_images(entries, limits, packed)
            with temporary(cache, PARTIAL, folder=True) as scratch:
                _write(images, scratch, limits, packed)
                scratch.rename(target)
    except _FAILURES as error:
        if target.is_dir():  # another process unpacked the same archive first
            return target
        kind = ArchiveLimitError if isinstance(error, ArchiveLimitError) else ValueError
        raise kind(f"cannot unpack archive {path}: {error}") from error
    return target


# The temporaries of unpacking (and of its callers) under a cache folder: each is held (an
# exclusive flock) while in use, so what nobody holds was left by a killed process.
PARTIAL, UPLOADING, FETCHING = ".partial-", ".upload-", ".fetch-"


@contextmanager
def temporary(
    cache: Path, prefix: str, suffix: str = "", *, folder: bool = False
) -> Iterator[Path]:
    """A new temporary file (or folder) in `cache`, held while in use and removed after."""
    cache.mkdir(parents=True, exist_ok=True)
    with _guarded(cache, fcntl.LOCK_SH):
        if folder:
            path = Path(tempfile.mkdtemp(suffix, prefix, cache))
            held = os.open(path, os.O_RDONLY)
        else:
            held, name = tempfile.mkstemp(suffix, prefix, cache)
            path = Path(name)
        fcntl.flock(held, fcntl.LOCK_EX)
    try:
        yield path
    finally:
        _remove(path)  # gone already if renamed into place
        os.close(held)


def sweep(cache: Path) -> list[str]:
    """Remove the temporaries in `cache` that no process holds; their names."""
    if not cache.is_dir():
        return []
    swept = []
    with _guarded(cache, fcntl.LOCK_EX):
        for path in cache.iterdir():
            if path.name.startswith((PARTIAL, UPLOADING, FETCHING)) and _unheld(path):
                _remove(path)
                swept.append(path.name)
    return swept


@contextmanager
def _guarded(cache: Path, kind: int) -> Iterator[None]:
    """Hold the folder itself: shared while a temporary is made and taken, exclusively while
    sweeping (so that none is swept between being made and being held)."""
    guard = os.open(cache, os.O_RDONLY)
    try:
        fcntl.flock(guard, kind)
        yield
    finally:
        os.close(guard)


def _unheld(path: Path) -> bool:
    """Whether no process holds the temporary at `path` (briefly taking it to know)."""
    try:
        probe = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(probe)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)

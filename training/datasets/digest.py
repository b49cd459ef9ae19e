"""A dataset's digest: sha256 over what was read, cached under the data root.

A folder of files (an ImageFolder tree, CIFAR's batches, the IDX files) is digested as
sha256 over one line `<relative path>\\0<sha256 of its bytes>\\n` per file, in sorted path
order; a single file (an uploaded archive, CIFAR's tar.gz) as the sha256 of its bytes, the
figure `sha256sum` prints; generated data as the sha256 of a canonical JSON description.
A digest is cached in `<data root>/.digests/`, keyed by the listing (paths, sizes and
modification times), so an unchanged dataset is not read again; a touched file is read
again and, its bytes unchanged, gives the same digest.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from training.datasets.archives import sha256_of

CACHE_FOLDER = ".digests"
# hashlib releases the GIL on large updates, so threads hash files in parallel.
THREADS = min(32, os.cpu_count() or 1)


def described(description: dict[str, Any]) -> str:
    """The digest of data generated from `description` (sorted-key, compact JSON)."""
    canonical = json.dumps(description, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def _listing(base: Path, files: Sequence[Path]) -> list[tuple[str, int, int]]:
    """(relative path, size, mtime in ns) of each file, sorted by path."""
    rows = []
    for path in files:
        status = path.stat()
        rows.append((path.relative_to(base).as_posix(), status.st_size, status.st_mtime_ns))
    return sorted(rows)


def _cache_file(cache: Path, kind: str, base: Path, listing: list[tuple[str, int, int]]) -> Path:
    """Where the digest of this exact listing is kept."""
    key = json.dumps([kind, str(base.resolve()), listing], separators=(",", ":"))
    return cache / f"{hashlib.sha256(key.encode()).hexdigest()}.json"


def _cached(place: Path) -> str | None:
    """The digest stored at `place`, if a readable one is there."""
    try:
        digest = json.loads(place.read_text())["digest"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return digest if isinstance(digest, str) and digest.startswith("sha256:") else None


def _store(place: Path, digest: str, files: int) -> None:
    """Write the digest atomically (a temporary file renamed into place); a read-only data
    root only loses the cache, never the load."""
    try:
        place.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(
            "w", dir=place.parent, prefix=".partial-", delete=False
        ) as scratch:
            json.dump({"digest": digest, "files": files}, scratch)
        os.replace(scratch.name, place)
    except OSError:
        return


def files_digest(base: Path, files: Sequence[Path], *, data_root: Path) -> str:
    """The digest of `files` (all below `base`): their relative paths and contents."""
    listing = _listing(base, files)
    place = _cache_file(data_root / CACHE_FOLDER, "files", base, listing)
    if (digest := _cached(place)) is not None:
        return digest
    ordered = [base / relative for relative, _, _ in listing]
    with ThreadPoolExecutor(THREADS) as pool:
        hashes = list(pool.map(sha256_of, ordered))
    lines = "".join(f"{row[0]}\0{sha}\n" for row, sha in zip(listing, hashes, strict=True))
    digest = "sha256:" + hashlib.sha256(lines.encode()).hexdigest()
    _store(place, digest, len(files))
    return digest


def _file_place(path: Path, data_root: Path) -> Path:
    """Where the digest of one file, as it is now, is kept."""
    return _cache_file(data_root / CACHE_FOLDER, "file", path.parent, _listing(path.parent, [path]))


def cached_file_digest(path: Path, *, data_root: Path) -> str | None:
    """The digest of one file if it is cached for the file as it is now, else None."""
    return _cached(_file_place(path, data_root))


def file_digest(path: Path, *, data_root: Path, known: str | None = None) -> str:
    """The digest of one file (an archive): "sha256:" and the sha256 of its bytes.

    `known` is a digest the caller has just computed from the bytes (an unpacking's), kept
    without reading the file again.
    """
    place = _file_place(path, data_root)
    if (digest := _cached(place)) is not None:
        return digest
    digest = known or "sha256:" + sha256_of(path)
    _store(place, digest, 1)
    return digest

"""Object storage of artifacts: a local folder or an S3 bucket, behind one interface.

An object is a file under a key, a relative POSIX path such as
`jobs/<job id>/checkpoints/step-100.pt`. Writers hash a file as they write it and `put` it
with its sha256; readers `fetch` it with the sha256 the database recorded and get a local
file whose bytes match that sha256, or an error that says why not:

- `ObjectMissingError`: no object under the key;
- `ObjectCorruptError`: the object's bytes do not match the sha256;
- `StoreUnavailableError`: the store cannot be reached now (connection refused or lost,
  timeouts, 5xx, throttling), after the client's own few retries; worth trying again.

`ARTIFACT_STORE` chooses the store: `local` keeps objects as files under `ARTIFACT_DIR`;
`s3` keeps them in the bucket `S3_BUCKET` and fetches them into a bounded local cache
(`ARTIFACT_CACHE_DIR`, at most `ARTIFACT_CACHE_BYTES`) of files named by their sha256.
Where the two differ, the store answers, so that no caller asks which it is: what a row
records for an object (`ref`: the local store's absolute path, or the key) and a local file
of it (`local_path`: the file as it lies, or the object fetched); copies of this machine's
files for other machines (`share`, `fetch_shared`, `delete_shared`: the bucket's, none in a
local folder that serves one machine); and this machine's working copies of stored files
(`release`: dropped where the bucket keeps the objects). Keys follow `core.layout`.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import time
import uuid
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, cast

import boto3
from boto3.exceptions import RetriesExceededError, S3UploadFailedError
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, HTTPClientError
from botocore.exceptions import ConnectionError as BotoConnectionError

from core.settings import Settings
from training.checkpoints import sha256_of

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_s3.literals import BucketLocationConstraintType

# A temporary file of a write in progress: a crash leaves it behind, never a partial object.
TEMP_SUFFIX = ".store-tmp"
SHA256 = re.compile(r"[0-9a-f]{64}")

# The S3 client tries a call this many times (with its own short, jittered backoff), so a
# dead store fails a call within seconds; callers retry within their job's lease. A read
# timeout bounds each wait for bytes, not a whole transfer.
CONNECT_TIMEOUT_SECONDS = 5.0
READ_TIMEOUT_SECONDS = 30.0
MAX_ATTEMPTS = 3
# HTTP statuses and error codes of an object store that is overloaded or failing for now.
TRANSIENT_STATUS = 500
THROTTLED_STATUS = 429
TRANSIENT_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "RequestLimitExceeded",
        "RequestThrottled",
        "TooManyRequestsException",
        "RequestTimeout",
        "RequestTimeoutException",
        "ServiceUnavailable",
        "InternalError",
    }
)
MISSING_CODES = frozenset({"404", "NoSuchKey", "NotFound", "NoSuchBucket"})
# A download that died with its process leaves a temporary file; after this long it goes.
STALE_TEMP_SECONDS = 3600.0
DELETE_BATCH = 1000  # the most keys one S3 DeleteObjects request takes


class StoreError(Exception):
    """An object store could not do what was asked."""


class StoreUnavailableError(StoreError):
    """The object store cannot be reached now; the same call may succeed later."""


class ObjectMissingError(StoreError):
    """No object under the key."""


class ObjectCorruptError(StoreError):
    """An object's bytes do not match the sha256 recorded for it."""


class Store(Protocol):
    """Where artifacts live: files under keys, each checked against its sha256 on fetch."""

    def put(self, key: str, source: Path, sha256: str) -> None:
        """Store the file `source` (already written and hashed) under `key`."""
        ...

    def fetch(self, key: str, sha256: str) -> Path:
        """A local file with the bytes of `key`, verified against `sha256`."""
        ...

    def delete_prefix(self, prefix: str) -> int:
        """Delete every object whose key starts with `prefix`; how many there were."""
        ...

    def keys(self, prefix: str = "") -> list[str]:
        """The keys that start with `prefix`, sorted."""
        ...

    def sizes(self, prefix: str = "") -> dict[str, int]:
        """The bytes of each object whose key starts with `prefix`."""
        ...

    def ref(self, key: str) -> str:
        """What a database row records for the object under `key` (`local_path` reads it)."""
        ...

    def key_of(self, ref: str) -> str | None:
        """The key of the object a row's recorded `ref` names; None when it names nothing
        of the store (a file elsewhere, or no plain key)."""
        ...

    def local_path(self, ref: str, sha256: str) -> Path:
        """A local file with the bytes a row's recorded `ref` names: a file of this machine
        as it is, else the object fetched and verified against `sha256`."""
        ...

    def share(self, key: str, source: Path, sha256: str) -> None:
        """Keep a copy of `source`, a file this machine holds outside the store, under `key`
        for the other machines that read the store."""
        ...

    def fetch_shared(self, prefix: str, sha256: str) -> tuple[str, Path] | None:
        """The first shared copy under `prefix` and a local file of it, verified; None when
        the store serves this machine alone (its own files are all there is)."""
        ...

    def delete_shared(self, prefix: str) -> int:
        """Delete the objects under `prefix` that live apart from this machine's files; how
        many (this machine's files go with their owner's own removal)."""
        ...

    def release(self, prefix: str) -> None:
        """Remove this machine's working copies (under `ARTIFACT_DIR`) of the objects under
        `prefix`, where the store keeps them apart; files that are the objects stay."""
        ...


def check_key(key: str) -> str:
    """`key` when it is a relative POSIX path without `.`, `..` or empty parts."""
    parts = key.split("/")
    if (
        not key
        or "\\" in key
        or any(part in ("", ".", "..") for part in parts)
        or key.endswith(TEMP_SUFFIX)
    ):
        raise ValueError(f"object key {key!r} is not a relative path like 'jobs/<id>/spec.json'")
    return key


def check_prefix(prefix: str) -> str:
    """`prefix` when it is empty or the start of a key (a folder ends with `/`)."""
    if prefix:
        check_key(prefix.removesuffix("/"))
    return prefix


def check_sha256(sha256: str) -> str:
    """`sha256` when it is a lowercase hex sha256 digest."""
    if SHA256.fullmatch(sha256) is None:
        raise ValueError(f"{sha256!r} is not a sha256 hex digest (64 lowercase hex digits)")
    return sha256


def verify(key: str, path: Path, sha256: str) -> None:
    """Raise ObjectCorruptError unless the file at `path` has the sha256 `sha256`."""
    actual = sha256_of(path)
    if actual != sha256:
        raise ObjectCorruptError(
            f"object {key!r} has sha256 {actual}, not the {sha256} recorded for it; it was "
            "changed or damaged after it was written"
        )


def copy_atomic(source: Path, target: Path) -> None:
    """Copy `source` to `target` so that readers see the old file or the new, never a part."""
    target.parent.mkdir(parents=True, exist_ok=True)
    temp = target.with_name(f".{target.name}.{uuid.uuid4().hex}{TEMP_SUFFIX}")
    try:
        shutil.copyfile(source, temp)
        fsync(temp)
        os.replace(temp, target)
    finally:
        temp.unlink(missing_ok=True)


def fsync(path: Path) -> None:
    """Flush a file's bytes to disk (so that a crash after a rename leaves no empty file)."""
    with path.open("rb") as f:
        os.fsync(f.fileno())


def recorded_file(ref: str) -> Path | None:
    """The file a row's recorded `ref` names, as the local store records objects (an
    absolute path); None when `ref` is an object key (relative)."""
    path = Path(ref)
    return path if path.is_absolute() else None


def is_temp(path: Path) -> bool:
    """Whether `path` is the temporary file of a write in progress (or of a crashed one)."""
    return path.name.endswith(TEMP_SUFFIX)


class Recorded(ABC):
    """How rows name objects, alike in both stores: by key, or by the absolute path of a
    file under `root`, this machine's `ARTIFACT_DIR` (as the local store records them)."""

    root: Path

    @abstractmethod
    def fetch(self, key: str, sha256: str) -> Path:
        """A local file with the bytes of `key`, verified against `sha256`."""

    def key_of(self, ref: str) -> str | None:
        """The key a row's `ref` names: the key itself, or a file's path below `root`."""
        file = recorded_file(ref)
        if file is None:
            try:
                return check_key(ref)  # as the row holds it, never normalised
            except ValueError:
                return None
        resolved = file.resolve()
        return (
            resolved.relative_to(self.root).as_posix()
            if resolved.is_relative_to(self.root)
            else None
        )

    def local_path(self, ref: str, sha256: str) -> Path:
        """The file a row's `ref` names as it is (no copy), else its object, fetched."""
        file = recorded_file(ref)
        return file if file is not None else self.fetch(ref, sha256)


class LocalStore(Recorded):
    """Objects as files under a folder (the default store, `ARTIFACT_DIR`).

    The store keeps no metadata: a fetch hashes the file and compares with the caller's
    sha256, the one the database recorded. It serves this machine alone: its files are
    the working copies, nothing is shared apart from them.
    """

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()

    def ref(self, key: str) -> str:
        """The object's file, as an absolute path."""
        return str(self.path_of(key))

    def path_of(self, key: str) -> Path:
        """Where the object `key` lives."""
        return self.root / check_key(key)

    def put(self, key: str, source: Path, sha256: str) -> None:
        """Copy `source` to the key's file, atomically (nothing to do if it already is it)."""
        check_sha256(sha256)
        target = self.path_of(key)
        if source.resolve() != target:
            copy_atomic(source, target)

    def fetch(self, key: str, sha256: str) -> Path:
        """The key's file, once its sha256 matches."""
        check_sha256(sha256)
        path = self.path_of(key)
        if not path.is_file():
            raise ObjectMissingError(f"object {key!r} is missing from {self.root}")
        verify(key, path, sha256)
        return path

    def delete_prefix(self, prefix: str) -> int:
        """Delete the files of every key under `prefix`, and the folders left empty."""
        if not check_prefix(prefix):
            raise ValueError("an empty prefix would delete the whole store")
        deleted = self.keys(prefix)
        for key in deleted:
            self.path_of(key).unlink(missing_ok=True)
        for key in deleted:
            self._prune(self.path_of(key).parent)
        return len(deleted)

    def keys(self, prefix: str = "") -> list[str]:
        """The keys under `prefix`, from the folder the prefix names down."""
        start = self.root / check_prefix(prefix).rpartition("/")[0]
        if not start.is_dir():
            return []
        found = (
            path.relative_to(self.root).as_posix()
            for path in start.rglob("*")
            if path.is_file() and not is_temp(path)
        )
        return sorted(key for key in found if key.startswith(prefix))

    def sizes(self, prefix: str = "") -> dict[str, int]:
        """The bytes of each file under `prefix` (one deleted meanwhile is left out)."""
        found = {}
        for key in self.keys(prefix):
            with contextlib.suppress(FileNotFoundError):
                found[key] = self.path_of(key).stat().st_size
        return found

    def share(self, key: str, source: Path, sha256: str) -> None:
        """Nothing to keep: no other machine reads this folder."""
        check_key(key)
        check_sha256(sha256)

    def fetch_shared(self, prefix: str, sha256: str) -> tuple[str, Path] | None:
        """None: nothing is shared apart from this machine's own files."""
        check_prefix(prefix)
        check_sha256(sha256)
        return None

    def delete_shared(self, prefix: str) -> int:
        """None to delete: the objects are this machine's files, which their owner removes."""
        check_prefix(prefix)
        return 0

    def release(self, prefix: str) -> None:
        """Nothing to release: the files are the objects."""
        check_prefix(prefix)

    def _prune(self, folder: Path) -> None:
        """Remove `folder` and its parents below the root while they are empty."""
        while folder != self.root and folder.is_relative_to(self.root):
            try:
                folder.rmdir()
            except OSError:  # not empty (or gone already)
                return
            folder = folder.parent


@dataclass(frozen=True)
class CacheEntry:
    """A file of the download cache, with its size and when it was last used."""

    path: Path
    size: int
    used_ns: int


class DownloadCache:
    """Fetched objects as files named by sha256 and size, at most `max_bytes` in all.

    Beyond the budget the least recently used files go, never the one just fetched; a
    returned path stays valid until the next fetch of any process that shares the folder
    evicts it, so callers open it at once (an open file outlives its eviction).
    """

    def __init__(self, root: Path, max_bytes: int) -> None:
        self.root = root
        self.max_bytes = max_bytes

    def lookup(self, sha256: str) -> Path | None:
        """The cached file of `sha256`, marked as used, if it is there whole."""
        for path in self.root.glob(f"{sha256}.*"):
            with contextlib.suppress(FileNotFoundError):  # another process evicted it
                if path.stat().st_size == recorded_size(path):
                    touch(path)
                    return path
                path.unlink()  # damaged (or not the cache's): fetch again
        return None

    def fill(self, key: str, sha256: str, download: Callable[[Path], None]) -> Path:
        """Download into a temporary file, verify it, add it under its sha256, evict."""
        self.root.mkdir(parents=True, exist_ok=True)
        temp = self.root / f".{sha256}.{uuid.uuid4().hex}{TEMP_SUFFIX}"
        try:
            download(temp)
            verify(key, temp, sha256)
            fsync(temp)
            path = self.root / f"{sha256}.{temp.stat().st_size}"
            os.replace(temp, path)
        finally:
            temp.unlink(missing_ok=True)
        touch(path)
        self.evict(keep=path)
        return path

    def entries(self) -> list[CacheEntry]:
        """The cached files, least recently used first."""
        found = []
        for path in self.root.glob("*"):
            with contextlib.suppress(FileNotFoundError):  # another process evicted it
                if not is_temp(path):
                    stat = path.stat()
                    found.append(CacheEntry(path, stat.st_size, stat.st_atime_ns))
        return sorted(found, key=lambda entry: entry.used_ns)

    def size(self) -> int:
        """The bytes the cached files take."""
        return sum(entry.size for entry in self.entries())

    def evict(self, keep: Path) -> None:
        """Remove the least recently used files until the cache fits its budget."""
        self.remove_stale_temps()
        entries = self.entries()
        total = sum(entry.size for entry in entries)
        for entry in entries:
            if total <= self.max_bytes:
                return
            if entry.path != keep:
                entry.path.unlink(missing_ok=True)
                total -= entry.size

    def remove_stale_temps(self) -> None:
        """Remove the temporary files of downloads that died long ago."""
        cutoff = time.time() - STALE_TEMP_SECONDS
        for path in self.root.glob(f"*{TEMP_SUFFIX}"):
            with contextlib.suppress(FileNotFoundError):
                if path.stat().st_mtime < cutoff:
                    path.unlink()


def recorded_size(path: Path) -> int | None:
    """The size a cached file had when it was verified (its name's suffix)."""
    suffix = path.suffix[1:]
    return int(suffix) if suffix.isdigit() else None


def touch(path: Path) -> None:
    """Mark a cached file as used now (explicitly: mounts may not update access times)."""
    now = time.time_ns()
    os.utime(path, ns=(now, now))


class S3Store(Recorded):
    """Objects in a bucket of an S3-compatible store, fetched into a bounded local cache.

    Workers write files into `ARTIFACT_DIR` (`root`) first, then put them to the bucket:
    those files are working copies, released once their job ends."""

    def __init__(self, settings: Settings) -> None:
        self.root = settings.artifact_dir.resolve()
        self.bucket = settings.s3_bucket
        self.endpoint = settings.s3_endpoint_url or "AWS S3"
        self.client = s3_client(settings)
        self.cache = DownloadCache(settings.artifact_cache_dir, settings.artifact_cache_bytes)
        self._bucket_ready = False

    def ensure_bucket(self) -> None:
        """Create the bucket if it does not exist yet (once per store)."""
        if self._bucket_ready:
            return
        with self.translated(f"bucket {self.bucket!r}"):
            try:
                self.client.head_bucket(Bucket=self.bucket)
            except ClientError as error:
                if error_code(error) not in MISSING_CODES:
                    raise
                self.create_bucket()
        self._bucket_ready = True

    def create_bucket(self) -> None:
        """Create the bucket in the client's region (one another process made is fine)."""
        region = self.client.meta.region_name
        try:
            if region == "us-east-1":  # the one region S3 refuses a location constraint for
                self.client.create_bucket(Bucket=self.bucket)
            else:
                self.client.create_bucket(
                    Bucket=self.bucket,
                    CreateBucketConfiguration={
                        "LocationConstraint": cast("BucketLocationConstraintType", region)
                    },
                )
        except ClientError as error:
            if error_code(error) not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                raise

    def put(self, key: str, source: Path, sha256: str) -> None:
        """Upload `source` under `key`, with its sha256 as the object's metadata."""
        check_key(key)
        check_sha256(sha256)
        self.ensure_bucket()
        with self.translated(f"object {key!r}"):
            self.client.upload_file(
                str(source), self.bucket, key, ExtraArgs={"Metadata": {"sha256": sha256}}
            )

    def fetch(self, key: str, sha256: str) -> Path:
        """The cached file of `sha256`, downloaded (and verified) first if not cached."""
        check_key(key)
        check_sha256(sha256)
        cached = self.cache.lookup(sha256)
        if cached is not None:
            return cached
        self.ensure_bucket()
        return self.cache.fill(key, sha256, lambda temp: self.download(key, temp))

    def download(self, key: str, target: Path) -> None:
        """Write the object's bytes to `target`."""
        with self.translated(f"object {key!r}"):
            self.client.download_file(self.bucket, key, str(target))

    def delete_prefix(self, prefix: str) -> int:
        """Delete every object under `prefix`, in batches of a thousand."""
        if not check_prefix(prefix):
            raise ValueError("an empty prefix would delete the whole bucket")
        doomed = self.keys(prefix)
        for start in range(0, len(doomed), DELETE_BATCH):
            self.delete_batch(doomed[start : start + DELETE_BATCH])
        return len(doomed)

    def delete_batch(self, keys: list[str]) -> None:
        """Delete up to a thousand objects in one request."""
        with self.translated(f"objects under {keys[0]!r}"):
            response = self.client.delete_objects(
                Bucket=self.bucket,
                Delete={"Objects": [{"Key": key} for key in keys], "Quiet": True},
            )
        if failed := response.get("Errors", []):
            first = failed[0]
            raise StoreError(
                f"{len(failed)} objects were not deleted from {self.location()}, e.g. "
                f"{first.get('Key')!r}: {first.get('Code')} {first.get('Message')}"
            )

    def keys(self, prefix: str = "") -> list[str]:
        """The keys under `prefix`, page by page."""
        return sorted(self.sizes(prefix))

    def sizes(self, prefix: str = "") -> dict[str, int]:
        """The bytes of each object under `prefix`, as the listing gives them, page by page."""
        check_prefix(prefix)
        self.ensure_bucket()
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=prefix
        )
        with self.translated(f"keys under {prefix!r}"):
            return {
                item["Key"]: item["Size"] for page in pages for item in page.get("Contents", [])
            }

    def ref(self, key: str) -> str:
        """The key itself."""
        return check_key(key)

    def share(self, key: str, source: Path, sha256: str) -> None:
        """Put the file under `key`."""
        self.put(key, source, sha256)

    def fetch_shared(self, prefix: str, sha256: str) -> tuple[str, Path] | None:
        """The first object under `prefix`, fetched; `ObjectMissingError` when there is none."""
        found = self.keys(prefix)
        if not found:
            raise ObjectMissingError(f"nothing under {prefix!r} is in {self.location()}")
        return found[0], self.fetch(found[0], sha256)

    def delete_shared(self, prefix: str) -> int:
        """Delete the objects under `prefix` (`delete_prefix`)."""
        return self.delete_prefix(prefix)

    def release(self, prefix: str) -> None:
        """Remove this machine's files under `prefix`, if it has any."""
        if not check_prefix(prefix):
            raise ValueError("an empty prefix would release the whole artifact folder")
        shutil.rmtree(self.root / prefix, ignore_errors=True)

    def location(self) -> str:
        """The bucket and its store, for messages."""
        return f"bucket {self.bucket!r} at {self.endpoint}"

    @contextlib.contextmanager
    def translated(self, subject: str) -> Iterator[None]:
        """Raise the boto errors of the block as the store's own."""
        try:
            yield
        except (BotoCoreError, ClientError, RetriesExceededError, S3UploadFailedError) as error:
            raise store_error(error, subject, self.location()) from error


def s3_client(settings: Settings) -> S3Client:
    """An S3 client of the settings' store, with short timeouts and few retries."""
    secret = settings.s3_secret_access_key
    config = Config(
        connect_timeout=CONNECT_TIMEOUT_SECONDS,
        read_timeout=READ_TIMEOUT_SECONDS,
        retries={"max_attempts": MAX_ATTEMPTS, "mode": "standard"},
        # Other S3-compatible stores (MinIO, Ceph) serve buckets as paths, not subdomains.
        s3={"addressing_style": "path" if settings.s3_endpoint_url else "auto"},
    )
    # A session of its own: boto3's default session is not safe to share across threads.
    return boto3.session.Session().client(
        "s3",
        endpoint_url=settings.s3_endpoint_url,
        region_name=settings.s3_region,
        aws_access_key_id=settings.s3_access_key_id,
        aws_secret_access_key=secret.get_secret_value() if secret else None,
        config=config,
    )


def store_error(error: Exception, subject: str, location: str) -> StoreError:
    """The store's error for a boto error about `subject`."""
    cause = unwrapped(error)
    if is_transient(cause):
        return StoreUnavailableError(
            f"{location} is unavailable ({type(cause).__name__}: {cause}); try again later"
        )
    if isinstance(cause, ClientError) and error_code(cause) in MISSING_CODES:
        return ObjectMissingError(f"{subject} is missing from {location}")
    return StoreError(f"{subject} at {location}: {type(cause).__name__}: {cause}")


def unwrapped(error: Exception) -> BaseException:
    """The error under boto3's transfer wrappers (which keep it only as text or an attribute)."""
    if isinstance(error, RetriesExceededError):
        last: object = getattr(error, "last_exception", None)  # untyped in the stubs
        return last if isinstance(last, BaseException) else error
    if isinstance(error, S3UploadFailedError):
        return error.__cause__ or error.__context__ or error
    return error


def is_transient(error: BaseException) -> bool:
    """Whether `error` says the store cannot serve now (rather than: never, as asked)."""
    if isinstance(error, BotoConnectionError | HTTPClientError):
        return True
    if isinstance(error, ClientError):
        status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        return (
            status >= TRANSIENT_STATUS
            or status == THROTTLED_STATUS
            or error_code(error) in TRANSIENT_CODES
        )
    return False


def error_code(error: ClientError) -> str:
    """The S3 error code of a client error ("NoSuchKey", "404", "SlowDown", ...)."""
    return str(error.response.get("Error", {}).get("Code", ""))


def shared_store(settings: Settings) -> Store | None:
    """The store when it keeps objects apart from this machine's `ARTIFACT_DIR`, so files
    written there must be put to it too; None when that folder is the store itself."""
    return store_for(settings) if settings.artifact_store == "s3" else None


_stores: dict[int, tuple[weakref.ref[Settings], Store]] = {}


def store_for(settings: Settings) -> Store:
    """The store `ARTIFACT_STORE` chooses, one per settings object."""
    cached = _stores.get(id(settings))
    if cached is not None and cached[0]() is settings:
        return cached[1]
    store: Store = (
        S3Store(settings) if settings.artifact_store == "s3" else LocalStore(settings.artifact_dir)
    )
    _stores[id(settings)] = (weakref.ref(settings), store)
    return store

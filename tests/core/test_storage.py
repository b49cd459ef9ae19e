"""The object stores of artifacts: a local folder, and S3 (a real moto server over HTTP)."""

from __future__ import annotations

import hashlib
import os
import time
import uuid
from pathlib import Path

import boto3
import pytest
from boto3.exceptions import S3UploadFailedError
from botocore.exceptions import ClientError, ReadTimeoutError

from core import layout
from core.settings import Settings
from core.storage import (
    LocalStore,
    ObjectCorruptError,
    ObjectMissingError,
    S3Store,
    Store,
    StoreError,
    StoreUnavailableError,
    check_key,
    recorded_file,
    shared_store,
    store_error,
    store_for,
)
from tests.services import free_port

WRONG_SHA256 = "0" * 64


def s3_settings(endpoint: str, tmp_path: Path, **changes: object) -> Settings:
    """Settings of an S3 store at `endpoint` with a bucket of the test's own and a cache
    under `tmp_path`."""
    values: dict[str, object] = {
        "artifact_store": "s3",
        "artifact_dir": tmp_path / "artifacts",
        "artifact_cache_dir": tmp_path / "cache",
        "s3_endpoint_url": endpoint,
        "s3_bucket": f"test-{uuid.uuid4().hex[:12]}",
        "s3_access_key_id": "testing",
        "s3_secret_access_key": "testing",
    }
    return Settings.model_validate(values | changes)


def written(path: Path, data: bytes) -> tuple[Path, str]:
    """`data` written to `path`, and its sha256."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path, hashlib.sha256(data).hexdigest()


def cached_files(tmp_path: Path) -> list[Path]:
    """Every file in the test's download cache, temporary ones included."""
    return sorted(path for path in (tmp_path / "cache").glob("*") if path.is_file())


def client_error(status: int, code: str) -> ClientError:
    """The error boto3 raises for an S3 answer with this status and code."""
    return ClientError(
        {
            "Error": {"Code": code, "Message": code},
            "ResponseMetadata": {
                "HTTPStatusCode": status,
                "HTTPHeaders": {},
                "RequestId": "",
                "HostId": "",
                "RetryAttempts": 2,
            },
        },
        "PutObject",
    )


def upload_failed(cause: ClientError) -> S3UploadFailedError:
    """boto3's upload error, which keeps the client error only as its context."""
    error = S3UploadFailedError("Failed to upload")
    error.__context__ = cause
    return error


def dead_endpoint() -> str:
    """The URL of a port of 127.0.0.1 that nothing listens on."""
    return f"http://127.0.0.1:{free_port()}"


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    """Each test that asks for it runs on a local folder and on an S3 bucket."""
    if request.param == "local":
        return LocalStore(tmp_path / "artifacts")
    return S3Store(s3_settings(request.getfixturevalue("s3_url"), tmp_path))


@pytest.fixture
def s3_store(s3_url: str, tmp_path: Path) -> S3Store:
    """An S3 store with a bucket of the test's own and a 10 KiB cache."""
    return S3Store(s3_settings(s3_url, tmp_path, artifact_cache_bytes=10 * 1024))


def test_put_then_fetch_gives_the_same_bytes(store: Store, tmp_path: Path) -> None:
    data = os.urandom(300_000)
    source, sha256 = written(tmp_path / "out" / "step-1.pt", data)
    store.put("jobs/a/checkpoints/step-1.pt", source, sha256)
    fetched = store.fetch("jobs/a/checkpoints/step-1.pt", sha256)
    assert fetched.read_bytes() == data
    assert hashlib.sha256(fetched.read_bytes()).hexdigest() == sha256
    assert store.keys() == ["jobs/a/checkpoints/step-1.pt"]


def test_put_replaces_an_object(store: Store, tmp_path: Path) -> None:
    store.put("jobs/a/summary.json", *written(tmp_path / "one", b"one"))
    source, sha256 = written(tmp_path / "two", b"two")
    store.put("jobs/a/summary.json", source, sha256)
    assert store.fetch("jobs/a/summary.json", sha256).read_bytes() == b"two"


def test_a_wrong_sha256_is_corrupt_and_caches_nothing(store: Store, tmp_path: Path) -> None:
    store.put("jobs/a/spec.json", *written(tmp_path / "spec.json", b"{}"))
    with pytest.raises(ObjectCorruptError, match=r"jobs/a/spec\.json"):
        store.fetch("jobs/a/spec.json", WRONG_SHA256)
    assert cached_files(tmp_path) == []


def test_a_missing_key_is_missing(store: Store, tmp_path: Path) -> None:
    with pytest.raises(ObjectMissingError, match=r"jobs/nobody/spec\.json"):
        store.fetch("jobs/nobody/spec.json", WRONG_SHA256)
    assert cached_files(tmp_path) == []


def test_delete_prefix_removes_exactly_that_prefix(store: Store, tmp_path: Path) -> None:
    doomed = ["jobs/a/spec.json", "jobs/a/checkpoints/step-1.pt", "jobs/a/checkpoints/step-2.pt"]
    kept = ["jobs/ab/spec.json", "jobs/b/spec.json", "models/a.pt"]
    for key in doomed + kept:
        store.put(key, *written(tmp_path / "file", key.encode()))
    assert store.delete_prefix("jobs/a/") == len(doomed)
    assert store.keys("jobs/a/") == []
    assert store.keys() == sorted(kept)
    assert store.delete_prefix("jobs/a/") == 0


def test_an_empty_prefix_deletes_nothing(store: Store, tmp_path: Path) -> None:
    store.put("jobs/a/spec.json", *written(tmp_path / "spec.json", b"{}"))
    with pytest.raises(ValueError, match="whole"):
        store.delete_prefix("")
    assert store.keys() == ["jobs/a/spec.json"]


@pytest.mark.parametrize("key", ["", "/etc/passwd", "jobs/../secret", "jobs//a", "a\\b"])
def test_keys_are_relative_paths(key: str) -> None:
    with pytest.raises(ValueError, match="relative path"):
        check_key(key)


def test_local_put_of_the_stored_file_itself_keeps_it(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "artifacts")
    source, sha256 = written(tmp_path / "artifacts" / "jobs" / "a" / "spec.json", b"{}")
    store.put("jobs/a/spec.json", source, sha256)
    assert store.fetch("jobs/a/spec.json", sha256) == source.resolve()
    assert sorted(path.name for path in source.parent.iterdir()) == ["spec.json"]


def test_local_delete_prefix_removes_emptied_folders(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "artifacts")
    store.put("jobs/a/checkpoints/step-1.pt", *written(tmp_path / "file", b"x"))
    store.put("jobs/b/spec.json", *written(tmp_path / "file", b"y"))
    store.delete_prefix("jobs/a/")
    assert not (tmp_path / "artifacts" / "jobs" / "a").exists()
    assert (tmp_path / "artifacts" / "jobs" / "b" / "spec.json").is_file()


def test_s3_delete_prefix_leaves_nothing_in_the_bucket(s3_store: S3Store, tmp_path: Path) -> None:
    for index in range(5):
        s3_store.put(f"jobs/a/metrics-{index}.jsonl", *written(tmp_path / "f", bytes([index])))
    s3_store.put("jobs/b/spec.json", *written(tmp_path / "f", b"{}"))
    s3_store.delete_prefix("jobs/a/")
    listing = s3_store.client.list_objects_v2(Bucket=s3_store.bucket)
    assert [item["Key"] for item in listing.get("Contents", [])] == ["jobs/b/spec.json"]


def test_s3_objects_carry_their_sha256(s3_store: S3Store, tmp_path: Path) -> None:
    source, sha256 = written(tmp_path / "spec.json", b"{}")
    s3_store.put("jobs/a/spec.json", source, sha256)
    head = s3_store.client.head_object(Bucket=s3_store.bucket, Key="jobs/a/spec.json")
    assert head["Metadata"] == {"sha256": sha256}


def test_s3_bucket_is_created_at_first_use(s3_url: str, s3_store: S3Store) -> None:
    assert s3_store.keys() == []
    client = boto3.client(
        "s3",
        endpoint_url=s3_url,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    assert s3_store.bucket in [bucket["Name"] for bucket in client.list_buckets()["Buckets"]]


def test_s3_cache_stays_within_its_budget(s3_store: S3Store, tmp_path: Path) -> None:
    objects = [written(tmp_path / f"f{index}", os.urandom(4 * 1024)) for index in range(6)]
    for index, (source, sha256) in enumerate(objects):
        s3_store.put(f"jobs/a/{index}", source, sha256)
        s3_store.fetch(f"jobs/a/{index}", sha256)
        assert s3_store.cache.size() <= 10 * 1024
    assert len(cached_files(tmp_path)) == 2  # the last two; temporary files all gone


def test_s3_cache_evicts_the_least_recently_used(s3_store: S3Store, tmp_path: Path) -> None:
    a, b, c = (written(tmp_path / name, os.urandom(4 * 1024)) for name in "abc")
    for name, (source, sha256) in zip("abc", (a, b, c), strict=True):
        s3_store.put(name, source, sha256)
    s3_store.fetch("a", a[1])
    s3_store.fetch("b", b[1])
    s3_store.fetch("a", a[1])  # a is now used more recently than b
    s3_store.fetch("c", c[1])
    cached = {path.name.split(".")[0] for path in cached_files(tmp_path)}
    assert cached == {a[1], c[1]}


def test_s3_cache_keeps_the_object_just_fetched_beyond_a_tiny_budget(
    s3_url: str, tmp_path: Path
) -> None:
    store = S3Store(s3_settings(s3_url, tmp_path, artifact_cache_bytes=100))
    for index in range(3):
        source, sha256 = written(tmp_path / "f", os.urandom(1000))
        store.put(f"jobs/a/{index}", source, sha256)
        assert store.fetch(f"jobs/a/{index}", sha256).read_bytes() == source.read_bytes()
        assert cached_files(tmp_path) == [store.cache.root / f"{sha256}.1000"]


def test_s3_cached_object_is_fetched_without_the_server(s3_url: str, tmp_path: Path) -> None:
    settings = s3_settings(s3_url, tmp_path)
    source, sha256 = written(tmp_path / "step-1.pt", os.urandom(5000))
    S3Store(settings).put("jobs/a/step-1.pt", source, sha256)
    S3Store(settings).fetch("jobs/a/step-1.pt", sha256)
    offline = S3Store(settings.model_copy(update={"s3_endpoint_url": dead_endpoint()}))
    assert offline.fetch("jobs/a/step-1.pt", sha256).read_bytes() == source.read_bytes()


def test_s3_damaged_cache_file_is_fetched_again(s3_store: S3Store, tmp_path: Path) -> None:
    source, sha256 = written(tmp_path / "step-1.pt", os.urandom(5000))
    s3_store.put("jobs/a/step-1.pt", source, sha256)
    s3_store.fetch("jobs/a/step-1.pt", sha256).write_bytes(b"")  # e.g. a crash, no fsync
    assert s3_store.fetch("jobs/a/step-1.pt", sha256).read_bytes() == source.read_bytes()


def test_s3_closed_port_is_unavailable_within_seconds(tmp_path: Path) -> None:
    store = S3Store(s3_settings(dead_endpoint(), tmp_path))
    source, sha256 = written(tmp_path / "step-1.pt", b"weights")
    started = time.monotonic()
    with pytest.raises(StoreUnavailableError, match="try again"):
        store.put("jobs/a/step-1.pt", source, sha256)
    with pytest.raises(StoreUnavailableError):
        store.fetch("jobs/a/step-1.pt", sha256)
    assert time.monotonic() - started < 15
    assert cached_files(tmp_path) == []


def test_sizes_give_each_objects_bytes(store: Store, tmp_path: Path) -> None:
    store.put("jobs/a/spec.json", *written(tmp_path / "spec.json", b"{}"))
    store.put("jobs/a/checkpoints/step-1.pt", *written(tmp_path / "step", b"x" * 1000))
    store.put("jobs/b/spec.json", *written(tmp_path / "other", b"{1}"))
    assert store.sizes("jobs/a/") == {"jobs/a/spec.json": 2, "jobs/a/checkpoints/step-1.pt": 1000}
    assert store.sizes("jobs/c/") == {}


def test_what_a_row_records_names_the_object_again(store: Store, tmp_path: Path) -> None:
    key = "jobs/a/checkpoints/best.pt"
    source, sha256 = written(tmp_path / "best.pt", b"weights")
    store.put(key, source, sha256)
    ref = store.ref(key)
    assert store.key_of(ref) == key
    local = store.local_path(ref, sha256)
    assert local.read_bytes() == b"weights"
    if isinstance(store, LocalStore):  # the file itself, no copy
        assert Path(ref) == local == tmp_path.resolve() / "artifacts" / key
    else:  # the key, fetched into the cache
        assert ref == key
        assert local.parent == tmp_path / "cache"


def test_a_recorded_file_is_read_where_it_lies(store: Store, tmp_path: Path) -> None:
    inside = tmp_path / "artifacts" / "jobs" / "x" / "checkpoints" / "step-1.pt"
    assert store.key_of(str(inside)) == "jobs/x/checkpoints/step-1.pt"
    assert store.key_of(str(tmp_path / "elsewhere" / "best.pt")) is None
    assert store.key_of("jobs/../secret.pt") is None
    assert store.key_of("jobs/a/spec.json") == "jobs/a/spec.json"
    # As the file is, unread: its reader verifies what it opens.
    assert store.local_path(str(inside), WRONG_SHA256) == inside
    assert recorded_file(str(inside)) == inside
    assert recorded_file("jobs/x/checkpoints/step-1.pt") is None


def test_only_a_bucket_shares_copies_of_this_machines_files(store: Store, tmp_path: Path) -> None:
    key = "uploads/abc/archive.zip"
    source, sha256 = written(tmp_path / "received.zip", b"an archive")
    store.share(key, source, sha256)
    shared = store.fetch_shared("uploads/abc/", sha256)
    if isinstance(store, LocalStore):
        assert shared is None
        assert store.keys() == []
        assert store.delete_shared("uploads/abc/") == 0
    else:
        assert shared is not None
        assert shared[0] == key
        assert shared[1].read_bytes() == b"an archive"
        assert store.delete_shared("uploads/abc/") == 1
        assert store.keys() == []
    assert source.read_bytes() == b"an archive"


def test_a_bucket_without_the_shared_copy_says_it_is_missing(s3_store: S3Store) -> None:
    with pytest.raises(ObjectMissingError, match="uploads/abc/"):
        s3_store.fetch_shared("uploads/abc/", WRONG_SHA256)


def test_release_removes_this_machines_copies_only_where_kept_apart(
    store: Store, tmp_path: Path
) -> None:
    key = "jobs/a/checkpoints/step-1.pt"
    working, sha256 = written(tmp_path / "artifacts" / key, b"x")
    store.put(key, working, sha256)
    other, _ = written(tmp_path / "artifacts" / "jobs" / "b" / "spec.json", b"{}")
    store.release("jobs/a/")
    assert working.exists() is isinstance(store, LocalStore)
    assert other.exists()
    assert store.fetch(key, sha256).read_bytes() == b"x"


def test_releasing_the_whole_folder_is_refused(s3_store: S3Store, tmp_path: Path) -> None:
    kept, _ = written(tmp_path / "artifacts" / "jobs" / "a" / "spec.json", b"{}")
    with pytest.raises(ValueError, match="whole"):
        s3_store.release("")
    assert kept.exists()


def test_job_layout_on_either_store(store: Store, tmp_path: Path) -> None:
    job_id = uuid.uuid4()
    keys = [
        layout.job_file_key(job_id, "summary.json"),
        layout.checkpoint_key(job_id, "step-10.pt"),
        layout.export_key(job_id, 7, ".onnx"),
    ]
    for key in keys:
        store.put(key, *written(tmp_path / "file", key.encode()))
    assert store.keys(layout.job_prefix(job_id)) == sorted(keys)
    assert store.keys(layout.checkpoints_prefix(job_id)) == [keys[1]]
    assert [key for key in store.keys("") if layout.is_export_key(key)] == [keys[2]]
    assert store.delete_prefix(layout.export_prefix(job_id, 7)) == 1
    assert store.keys() == sorted(keys[:2])


def test_only_a_bucket_is_a_shared_store(s3_url: str, tmp_path: Path) -> None:
    local = Settings(artifact_dir=tmp_path / "artifacts")
    s3 = s3_settings(s3_url, tmp_path)
    assert shared_store(local) is None
    assert shared_store(s3) is store_for(s3)


def test_store_for_chooses_by_setting_and_keeps_one_per_settings(
    s3_url: str, tmp_path: Path
) -> None:
    local = Settings(artifact_dir=tmp_path / "artifacts")
    s3 = s3_settings(s3_url, tmp_path)
    assert isinstance(store_for(local), LocalStore)
    assert isinstance(store_for(s3), S3Store)
    assert store_for(s3) is store_for(s3)
    assert store_for(s3) is not store_for(s3.model_copy())


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (client_error(503, "SlowDown"), StoreUnavailableError),
        (client_error(500, "InternalError"), StoreUnavailableError),
        (client_error(400, "RequestTimeout"), StoreUnavailableError),
        (ReadTimeoutError(endpoint_url="http://store"), StoreUnavailableError),
        (upload_failed(client_error(503, "ServiceUnavailable")), StoreUnavailableError),
        (client_error(404, "NoSuchKey"), ObjectMissingError),
        (client_error(403, "AccessDenied"), StoreError),
    ],
)
def test_store_errors_say_whether_to_try_again(error: Exception, expected: type) -> None:
    translated = store_error(error, "object 'jobs/a/spec.json'", "bucket 'b'")
    assert type(translated) is expected

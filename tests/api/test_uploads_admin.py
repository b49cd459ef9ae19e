"""Upload limits and upkeep: zip bombs and oversized archives refused with nothing kept, the
per-owner quota, and listing and deleting uploads (not while a job reads them)."""

from __future__ import annotations

import io
import os
import shutil
import tarfile
import tracemalloc
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient
from sqlalchemy import delete

from core import uploads
from core.db.session import session_scope
from core.db.tables import Upload
from core.settings import Settings
from tests.helpers import make_key
from training.datasets.archives import (
    MAX_HEADER_BYTES,
    ArchiveLimitError,
    Entry,
    Limits,
    _write,
    check_zip_index,
    unpack_archive,
)

DATASETS = "/api/v1/datasets"
UPLOADS = f"{DATASETS}/uploads"
KIB = 1024


@pytest.fixture(scope="module")
def settings(settings: Settings) -> Settings:
    """Small limits, so that tests stay small: 40 KiB unpacked, ratio 20, quota 100 KiB on
    disk (two 20 KiB uploads take 40 KiB each in 4 KiB blocks) and 10 files."""
    return settings.model_copy(
        update={
            "upload_max_unpacked_bytes": 40 * KIB,
            "upload_max_ratio": 20.0,
            "upload_quota_bytes": 100 * KIB,
            "upload_quota_files": 10,
        }
    )


@pytest.fixture(autouse=True)
def no_uploads(settings: Settings) -> None:
    """Each test starts with no uploads kept."""
    shutil.rmtree(uploads.folder(settings), ignore_errors=True)
    with session_scope(settings.database_url) as session:
        session.execute(delete(Upload))


def _zip(files: dict[str, bytes], method: int = zipfile.ZIP_STORED) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=method) as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def _images(kib: int, tag: str) -> bytes:
    """A stored (uncompressed) zip of two classes holding `kib` KiB of incompressible files."""
    half = kib * KIB // 2
    return _zip({f"{tag}/a/1.png": os.urandom(half), f"{tag}/b/1.png": os.urandom(half)})


def _post(client: TestClient, name: str, data: bytes) -> dict[str, Any]:
    response = client.post(DATASETS, files={"file": (name, data, "application/zip")})
    return {"status": response.status_code, **response.json()}


def _kept(settings: Settings) -> list[Path]:
    """Every file and folder under DATA_DIR (temporary ones included)."""
    return sorted(settings.data_dir.rglob("*")) if settings.data_dir.exists() else []


def test_a_zip_bomb_is_refused_by_its_ratio_with_nothing_kept(
    client: TestClient, settings: Settings
) -> None:
    bomb = _zip({"a/zeros.png": bytes(30 * KIB), "b/z.png": b"x"}, zipfile.ZIP_DEFLATED)
    assert len(bomb) * 20 < 30 * KIB  # under the size limit, over the ratio
    before = _kept(settings)
    answer = _post(client, "bomb.zip", bomb)
    assert answer["status"] == 413, answer
    message = answer["error"]["message"]
    assert "compression ratio" in message
    assert "UPLOAD_MAX_RATIO 20" in message
    assert str(settings.data_dir) not in message
    assert [p for p in _kept(settings) if p not in before and p.is_file()] == []
    assert not list(uploads.folder(settings).glob(".*"))  # no archive, no partial folder


def test_an_archive_unpacking_past_the_size_limit_is_refused(
    client: TestClient, settings: Settings
) -> None:
    answer = _post(client, "big.zip", _images(44, "big"))
    assert answer["status"] == 413, answer
    assert "more than 40960 bytes" in answer["error"]["message"]
    assert "UPLOAD_MAX_UNPACKED_BYTES 40,960" in answer["error"]["message"]
    assert client.get(UPLOADS).json() == []
    assert not list(uploads.folder(settings).iterdir())


def test_bytes_are_counted_while_unpacking_whatever_the_header_says(tmp_path: Path) -> None:
    lying = Entry(("a", "x.png"), 10, True, lambda: io.BytesIO(bytes(4 * KIB)))
    with pytest.raises(ArchiveLimitError, match="more than 1000 bytes"):
        _write([lying], tmp_path, Limits(max_bytes=1000), packed=1000)


def test_each_owner_has_a_quota_of_what_it_keeps_and_deleting_frees_it(
    client: TestClient, settings: Settings
) -> None:
    first = _post(client, "one.zip", _images(20, "one"))
    second = _post(client, "two.zip", _images(20, "two"))
    assert (first["status"], second["status"]) == (201, 201)
    third = _post(client, "three.zip", _images(20, "three"))
    assert third["status"] == 413, third
    assert "upload quota" in third["error"]["message"]
    assert "UPLOAD_QUOTA_BYTES 102,400 on disk" in third["error"]["message"]

    other_key = make_key(settings.database_url, "read", "train")
    other = TestClient(client.app, headers={"Authorization": f"Bearer {other_key}"})
    theirs = _post(other, "three.zip", _images(20, "three"))
    assert theirs["status"] == 201, theirs  # another owner, another quota

    listed = {item["path"]: item for item in client.get(UPLOADS).json()}
    assert set(listed) == {first["path"], second["path"], theirs["path"]}
    for item in listed.values():  # what the disk holds: blocks of the files and folders
        assert (item["bytes"], item["files"]) == uploads.on_disk(settings.data_dir / item["path"])
        assert item["bytes"] >= 20 * KIB + 4 * 4 * KIB
    mine = listed[first["path"]]
    assert mine["owner"] != listed[theirs["path"]]["owner"]
    refused = other.delete(f"{UPLOADS}/{mine['id']}")
    assert refused.status_code == 403, refused.text
    assert client.delete(f"{UPLOADS}/{mine['id']}").status_code == 204
    assert not (settings.data_dir / first["path"]).exists()
    assert _post(client, "four.zip", _images(20, "four"))["status"] == 201


def test_uploads_sent_at_once_cannot_together_pass_the_quota(
    client: TestClient, settings: Settings
) -> None:
    archives = [(f"{tag}.zip", _images(20, tag)) for tag in ("a", "b", "c", "d")]
    with ThreadPoolExecutor(max_workers=len(archives)) as pool:
        answers = list(pool.map(lambda sent: _post(client, *sent), archives))
    assert sorted(answer["status"] for answer in answers) == [201, 201, 413, 413], answers
    listed = client.get(UPLOADS).json()
    assert sum(item["bytes"] for item in listed) <= 100 * KIB  # within the quota
    kept = {path.name for path in uploads.folder(settings).iterdir()}
    assert kept == {item["id"] for item in listed}  # the refused left nothing behind


def test_an_archive_two_owners_sent_is_kept_until_both_deleted_it(
    client: TestClient, settings: Settings
) -> None:
    other_key = make_key(settings.database_url, "read", "train")
    other = TestClient(client.app, headers={"Authorization": f"Bearer {other_key}"})
    archive = _images(4, "shared")
    mine, theirs = _post(client, "a.zip", archive), _post(other, "b.zip", archive)
    assert mine["path"] == theirs["path"]
    assert _post(client, "a.zip", archive)["status"] == 201  # the same row again
    upload_id = Path(mine["path"]).name
    assert [item["id"] for item in client.get(UPLOADS).json()] == [upload_id, upload_id]
    assert client.delete(f"{UPLOADS}/{upload_id}").status_code == 204
    assert (settings.data_dir / mine["path"]).is_dir()  # the other owner keeps it
    assert other.delete(f"{UPLOADS}/{upload_id}").status_code == 204
    assert not (settings.data_dir / mine["path"]).exists()


def test_an_upload_a_queued_job_reads_is_kept_until_the_job_ends(
    client: TestClient, settings: Settings, queue: redis.Redis
) -> None:
    upload = _post(client, "shapes.zip", _images(4, "shapes"))
    upload_id = Path(upload["path"]).name
    dataset = {"name": "imagefolder", "path": f"{upload['path']}/shapes", "validation": 0}
    job = {"kind": "train", "model": {"name": "resnet8"}, "dataset": dataset}
    submitted = client.post("/api/v1/jobs", json=job)
    assert submitted.status_code == 202, submitted.text
    job_id = submitted.json()["id"]

    refused = client.delete(f"{UPLOADS}/{upload_id}")
    assert refused.status_code == 409
    assert job_id in refused.json()["error"]["message"]
    assert (settings.data_dir / upload["path"]).is_dir()

    assert client.post(f"/api/v1/jobs/{job_id}/cancel").status_code == 200
    assert client.delete(f"{UPLOADS}/{upload_id}").status_code == 204
    assert client.get(UPLOADS).json() == []
    assert client.delete(f"{UPLOADS}/{upload_id}").status_code == 404
    bad = client.delete(f"{UPLOADS}/..%2F..%2Fetc")
    assert bad.status_code in (404, 422)
    assert client.delete(f"{UPLOADS}/{'z' * 64}").status_code == 422


def test_many_tiny_files_count_the_blocks_they_take_and_the_files_quota(
    client: TestClient, settings: Settings
) -> None:
    tiny = _zip({f"tiny/{'ab'[i % 2]}/{i}.png": b"x" for i in range(5)})
    kept = _post(client, "tiny.zip", tiny)
    assert kept["status"] == 201, kept
    tree = settings.data_dir / kept["path"]
    assert (kept["bytes"], kept["files"]) == uploads.on_disk(tree)
    assert kept["bytes"] >= (5 + 4) * 4 * KIB  # a block a file and folder, not a byte a file

    many = _zip({f"many/a/{i}.png": b"x" for i in range(8)})  # 5 + 8 > 10 files
    refused = _post(client, "many.zip", many)
    assert refused["status"] == 413, refused
    assert "files left of the upload file quota" in refused["error"]["message"]
    assert "UPLOAD_QUOTA_FILES 10" in refused["error"]["message"]
    assert [item["path"] for item in client.get(UPLOADS).json()] == [kept["path"]]


def _tar_gz(members: list[tarfile.TarInfo]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", format=tarfile.PAX_FORMAT) as archive:
        for member in members:
            archive.addfile(member)
    return buffer.getvalue()


def _member(name: str, **pax: str) -> tarfile.TarInfo:
    member = tarfile.TarInfo(name)
    member.pax_headers = pax
    return member


def test_a_tar_header_of_megabytes_is_refused_before_it_is_read(
    client: TestClient, settings: Settings, tmp_path: Path
) -> None:
    bomb = _tar_gz([_member("a/1.png", comment="x" * 20 * 2**20)])  # 20 MiB in 20 KiB
    files = {"file": ("bomb.tar.gz", bomb, "application/gzip")}
    answer = client.post(DATASETS, files=files).json()
    assert "extended header" in answer["error"]["message"], answer
    assert f"more than {MAX_HEADER_BYTES}" in answer["error"]["message"]
    assert not list(uploads.folder(settings).iterdir())

    path = tmp_path / "bomb.tar.gz"
    path.write_bytes(bomb)
    tracemalloc.start()
    with pytest.raises(ArchiveLimitError, match="extended header"):
        unpack_archive(path, tmp_path / "cache")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 4 * 2**20  # tarfile would have held the whole 20 MiB header


def test_a_tar_of_too_many_entries_is_refused_as_they_are_read(tmp_path: Path) -> None:
    path = tmp_path / "many.tar.gz"
    path.write_bytes(_tar_gz([_member(f"a/{i}.png") for i in range(30)]))
    with pytest.raises(ArchiveLimitError, match="more than 10 entries"):
        unpack_archive(path, tmp_path / "cache", max_entries=10)
    assert unpack_archive(path, tmp_path / "cache", max_entries=30).is_dir()


def test_a_zip_listing_too_many_entries_is_refused_before_its_directory_is_loaded(
    tmp_path: Path,
) -> None:
    path = tmp_path / "many.zip"
    path.write_bytes(_zip({f"a/{i}.png": b"" for i in range(5)}))
    with pytest.raises(ArchiveLimitError, match="5 entries, more than 4"):
        check_zip_index(path, 4)  # from the end record's count
    check_zip_index(path, 5)
    # An end record that understates its count: the directory's headers are counted.
    data = bytearray(path.read_bytes())
    end = data.rindex(b"PK\x05\x06")
    data[end + 8 : end + 12] = (1).to_bytes(2, "little") * 2
    path.write_bytes(bytes(data))
    with pytest.raises(ArchiveLimitError, match="more than 4 entries"):
        check_zip_index(path, 4)

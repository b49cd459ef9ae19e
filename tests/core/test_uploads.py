"""Uploaded dataset archives on a real database and the local store: unpacked within the
owner's quota, kept once, listed for who may read them, deleted by their owner unless a
job reads them."""

from __future__ import annotations

import hashlib
import random
import uuid
import zipfile
from pathlib import Path

import pytest
from sqlalchemy import update

from core import uploads
from core.db.session import session_scope
from core.db.tables import Job, Upload
from core.errors import ConflictError, InvalidError, NotFoundError, NotOwnedError
from core.owners import ANYONE, Caller
from core.settings import Settings
from tests import images
from tests.helpers import caller_of, new_job
from training.datasets.archives import ArchiveLimitError


def _archive(folder: Path, names: list[str]) -> Path:
    """A zip of one-colour PNGs under `names`, unlike any other archive of the module."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{uuid.uuid4().hex}.zip"
    with zipfile.ZipFile(path, "w") as archive:
        for name in names:
            shade = tuple(random.randrange(256) for _ in range(3))
            archive.writestr(name, images.flat_png(shade))  # type: ignore[arg-type]
    return path


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _store(settings: Settings, archive: Path, owner: Caller) -> Upload:
    with session_scope(settings.database_url) as session:
        row = uploads.store(archive, session=session, settings=settings, owner=owner.owner)
        session.expunge(row)
    return row


@pytest.fixture(scope="module")
def alice(settings: Settings) -> Caller:
    return caller_of(settings.database_url, "read", "train")


@pytest.fixture(scope="module")
def bob(settings: Settings) -> Caller:
    return caller_of(settings.database_url, "read", "train")


@pytest.fixture
def pets(tmp_path: Path) -> Path:
    return _archive(tmp_path, ["pets/cat/0.png", "pets/cat/1.png", "pets/dog/0.png"])


def test_an_archive_is_unpacked_under_its_sha256_and_counted(
    settings: Settings, alice: Caller, pets: Path
) -> None:
    row = _store(settings, pets, alice)
    tree = uploads.folder(settings) / row.sha256
    assert sorted(p.name for p in tree.rglob("*.png")) == ["0.png", "0.png", "1.png"]
    assert (row.files, row.owner_key_id) == (3, alice.owner)
    assert row.bytes >= 3 * 512  # what the disk holds, in blocks
    assert uploads.path_of(row.sha256) == f"uploads/{row.sha256}"
    assert uploads.upload_of({"name": "imagefolder", "path": f"uploads/{row.sha256}/pets"}) == (
        row.sha256
    )
    with session_scope(settings.database_url) as session:
        assert uploads.usage(session=session, owner=alice.owner) >= (row.bytes, 3)


def test_an_archive_sent_again_by_its_owner_is_the_same_upload(
    settings: Settings, alice: Caller, bob: Caller, pets: Path
) -> None:
    first = _store(settings, pets, alice)
    again = _store(settings, pets, alice)
    theirs = _store(settings, pets, bob)
    assert again.id == first.id
    assert theirs.id != first.id
    assert theirs.sha256 == first.sha256


def test_an_archive_without_images_is_refused_and_nothing_kept(
    settings: Settings, alice: Caller, tmp_path: Path
) -> None:
    empty = tmp_path / "empty.zip"
    with zipfile.ZipFile(empty, "w") as archive:
        archive.writestr("notes/", "")
    with pytest.raises(InvalidError, match="holds no images"):
        _store(settings, empty, alice)
    assert not (uploads.folder(settings) / _sha256(empty)).exists()


def test_an_archive_past_the_owners_file_quota_is_refused_and_nothing_kept(
    settings: Settings, tmp_path: Path
) -> None:
    owner = caller_of(settings.database_url, "train")
    small = settings.model_copy(update={"upload_quota_files": 2})
    archive = _archive(tmp_path, ["a/x/0.png", "a/x/1.png", "a/y/0.png"])
    with pytest.raises(ArchiveLimitError, match="quota"):
        _store(small, archive, owner)
    with session_scope(settings.database_url) as session:
        assert uploads.usage(session=session, owner=owner.owner) == (0, 0)
    assert not (uploads.folder(settings) / _sha256(archive)).exists()


def test_a_private_reader_lists_only_its_own_uploads(
    settings: Settings, alice: Caller, bob: Caller, tmp_path: Path
) -> None:
    mine = _store(settings, _archive(tmp_path, ["a/x/0.png"]), alice)
    theirs = _store(settings, _archive(tmp_path, ["b/x/0.png"]), bob)
    with session_scope(settings.database_url) as session:
        everyone = {row.id for row in uploads.visible(session=session, caller=alice)}
        own = Caller(alice.key, own_reads_only=True)
        private = {row.id for row in uploads.visible(session=session, caller=own)}
    assert {mine.id, theirs.id} <= everyone
    assert mine.id in private
    assert theirs.id not in private


def test_an_upload_is_deleted_by_its_owner_once_no_job_reads_it(
    settings: Settings, alice: Caller, bob: Caller, tmp_path: Path
) -> None:
    row = _store(settings, _archive(tmp_path, ["c/x/0.png"]), alice)
    url, upload_id = settings.database_url, row.sha256
    reader = new_job(url)
    dataset = {"name": "imagefolder", "path": uploads.path_of(upload_id)}
    with session_scope(url) as session:
        session.execute(update(Job).where(Job.id == reader).values(spec={"dataset": dataset}))
    with session_scope(url) as session:
        with pytest.raises(NotOwnedError, match=f"does not own upload {upload_id}"):
            uploads.delete(session=session, settings=settings, caller=bob, upload_id=upload_id)
        with pytest.raises(ConflictError, match=f"dataset of 1 queued or running job.*{reader}"):
            uploads.delete(session=session, settings=settings, caller=alice, upload_id=upload_id)
    with session_scope(url) as session:
        session.execute(update(Job).where(Job.id == reader).values(status="cancelled"))
    with session_scope(url) as session:
        tree = uploads.delete(session=session, settings=settings, caller=alice, upload_id=upload_id)
    assert tree == uploads.folder(settings) / upload_id  # the caller removes it once committed
    with session_scope(url) as session, pytest.raises(NotFoundError, match="does not exist"):
        uploads.delete(session=session, settings=settings, caller=ANYONE, upload_id="0" * 64)
    with session_scope(url) as session, pytest.raises(InvalidError, match="is not an upload id"):
        uploads.delete(session=session, settings=settings, caller=ANYONE, upload_id="../x")


def test_an_upload_this_machine_has_is_materialized_as_it_is(
    settings: Settings, alice: Caller, pets: Path
) -> None:
    row = _store(settings, pets, alice)
    dataset = {"name": "imagefolder", "path": uploads.path_of(row.sha256)}
    assert uploads.materialize(settings, dataset) == uploads.folder(settings) / row.sha256
    assert uploads.materialize(settings, {"name": "digits"}) is None

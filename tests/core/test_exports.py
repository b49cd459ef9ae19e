"""A version's exports on a real database and the local store: rows found and listed, the
stored one handed back as is, a key's turns, files deleted with their version, stored files
opened only when their bytes match."""

from __future__ import annotations

import hashlib
import uuid
from pathlib import Path

import pytest

from core import exports, layout, model_registry
from core.claims import claims
from core.db.session import session_scope
from core.db.tables import ModelExport, ModelVersion
from core.errors import NotFoundError
from core.owners import Caller
from core.settings import Settings
from core.storage import store_for
from tests.helpers import caller_of, recorded_job
from training.checkpoints import CheckpointError


def _version(settings: Settings, caller: Caller) -> tuple[str, ModelVersion]:
    """A new model of `caller`'s with one version; its name and the version's row."""
    url, name = settings.database_url, f"m-{uuid.uuid4().hex[:8]}"
    job_id = recorded_job(url, owner=caller.owner)
    with session_scope(url) as session:
        row = model_registry.register(session=session, name=name, job_id=job_id, caller=caller)
        session.expunge(row)
    return name, row


def _stored(settings: Settings, version: ModelVersion, fmt: str, data: bytes) -> ModelExport:
    """An export of `version` in `fmt` put to the store as `exports.create` leaves one."""
    key = layout.export_key(version.job_id, version.id, f".{fmt}")
    source = settings.artifact_dir.parent / f"{uuid.uuid4().hex}.bin"
    source.parent.mkdir(parents=True, exist_ok=True)
    source.write_bytes(data)
    sha256 = hashlib.sha256(data).hexdigest()
    store = store_for(settings)
    store.put(key, source, sha256)
    row = ModelExport(
        version_id=version.id,
        format=fmt,
        path=store.ref(key),
        sha256=sha256,
        bytes=len(data),
        max_abs_diff=0.0,
        tolerance=1e-4,
        details={},
    )
    with session_scope(settings.database_url) as session:
        session.add(row)
        session.flush()
        session.expunge(row)
    return row


@pytest.fixture(scope="module")
def owner(settings: Settings) -> Caller:
    return caller_of(settings.database_url, "train")


def test_a_versions_exports_are_found_by_format_and_listed_in_format_order(
    settings: Settings, owner: Caller
) -> None:
    _, version = _version(settings, owner)
    _stored(settings, version, "torchscript", b"ts")
    onnx = _stored(settings, version, "onnx", b"onnx")
    _, other = _version(settings, owner)
    with session_scope(settings.database_url) as session:
        found = exports.find(session=session, version_id=version.id, fmt="onnx")
        assert found is not None
        assert found.id == onnx.id
        assert exports.find(session=session, version_id=other.id, fmt="onnx") is None
        listed = exports.listed(session=session, version_id=version.id)
        assert [row.format for row in listed] == ["onnx", "torchscript"]


def test_get_names_the_request_that_makes_a_missing_export(
    settings: Settings, owner: Caller
) -> None:
    name, version = _version(settings, owner)
    made = _stored(settings, version, "onnx", b"onnx")
    with session_scope(settings.database_url) as session:
        target, row = exports.get(session=session, name=name, version=1, fmt="onnx", caller=owner)
        assert (target.id, row.id) == (version.id, made.id)
        with pytest.raises(NotFoundError, match=f"{name}/1 has no torchscript export yet; POST"):
            exports.get(session=session, name=name, version=1, fmt="torchscript", caller=owner)
        with pytest.raises(NotFoundError, match="has no version 2"):
            exports.get(session=session, name=name, version=2, fmt="onnx", caller=owner)


def test_a_stored_export_is_handed_back_without_making_another(
    settings: Settings, owner: Caller
) -> None:
    name, version = _version(settings, owner)
    made = _stored(settings, version, "onnx", b"onnx")
    with session_scope(settings.database_url) as session:
        row, new = exports.create(
            session=session, settings=settings, name=name, version=1, fmt="onnx", caller=owner
        )
    assert (row.id, new) == (made.id, False)


def test_a_key_whose_export_turns_are_all_taken_is_told_to_try_again(
    settings: Settings, owner: Caller
) -> None:
    name, _ = _version(settings, owner)
    one_turn = settings.model_copy(update={"exports_per_key": 1})
    with claims(settings.database_url) as held:
        assert held.take(f"export-key:{owner.owner}:0")  # another request's export
        with (
            session_scope(settings.database_url) as session,
            pytest.raises(exports.ExportsBusyError, match=r"1 exports being made now"),
        ):
            exports.create(
                session=session, settings=one_turn, name=name, version=1, fmt="onnx", caller=owner
            )


def test_deleting_a_versions_files_deletes_its_exports_only(
    settings: Settings, owner: Caller
) -> None:
    _, version = _version(settings, owner)
    _, other = _version(settings, owner)
    onnx = _stored(settings, version, "onnx", b"onnx")
    torchscript = _stored(settings, version, "torchscript", b"ts")
    kept = _stored(settings, other, "onnx", b"other")
    assert exports.delete_files(settings, version) == 2
    assert not Path(onnx.path).exists()
    assert not Path(torchscript.path).exists()
    assert Path(kept.path).read_bytes() == b"other"


def test_a_stored_file_opens_at_its_start_only_when_its_bytes_match(
    settings: Settings, owner: Caller
) -> None:
    _, version = _version(settings, owner)
    row = _stored(settings, version, "onnx", b"exported net")
    with exports.open_verified(settings, row.path, row.sha256) as handle:
        assert handle.read() == b"exported net"
    Path(row.path).write_bytes(b"exported nEt")
    with pytest.raises(CheckpointError, match=f"not the {row.sha256} recorded"):
        exports.open_verified(settings, row.path, row.sha256)
    Path(row.path).unlink()
    with pytest.raises(CheckpointError, match="is missing from the artifact store"):
        exports.open_verified(settings, row.path, row.sha256)

"""A registered version's exports (ONNX, TorchScript, torch.export), and the files the
registry hands out.

An export is made once per version and format: the version's checkpoint is loaded, its
served net written and checked against the eager net (`training.export`), and only an
export within the bound is put to the artifact store, beside its job's checkpoints
(`core.layout`):

    jobs/<job id>/exports/<version row id>/model.onnx | model.torchscript.pt | model.pt2
                                          | model.int8.onnx

An int8 graph (`onnx_int8`, `training.quantize`) is calibrated on the run's training images
(read from `DATA_DIR`) and kept only when its evaluation error is within the request's bound
of the float graph's; the figures go into the row's details. A model process serves it
with `PREDICT_BACKEND=onnxruntime_int8` (`int8_graph` finds it).

A `model_export` row records its path (what the store records for it: a key in a bucket,
else the local store's absolute path, as checkpoint rows do), sha256, size and the check's
figures. Deleting a version deletes its exports' files; the rows go with the version (ON
DELETE CASCADE).
Keyword-only service functions over a caller-owned session (the caller commits).
"""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path
from typing import BinaryIO

from sqlalchemy import select
from sqlalchemy.orm import Session

from core import artifacts, layout, model_registry, usage
from core.claims import Claims, claims
from core.db.session import session_scope
from core.db.tables import ModelExport, ModelVersion, RegisteredModel
from core.errors import NotFoundError
from core.owners import Caller
from core.settings import Settings
from core.storage import store_for
from training import export, exporter, quantize
from training.checkpoints import CheckpointError, sha256_of

READ_CHUNK = 1024 * 1024
EXPORTS_ROUTE = "/api/v1/registry/{name}/versions/{version}/exports"


def find(*, session: Session, version_id: int, fmt: str) -> ModelExport | None:
    """The version's export in `fmt`, if made."""
    query = select(ModelExport).where(
        ModelExport.version_id == version_id, ModelExport.format == fmt
    )
    return session.scalars(query).first()


def listed(*, session: Session, version_id: int) -> list[ModelExport]:
    """The version's exports, in format order."""
    query = select(ModelExport).where(ModelExport.version_id == version_id)
    return list(session.scalars(query.order_by(ModelExport.format)))


def get(
    *, session: Session, name: str, version: int, fmt: str, caller: Caller
) -> tuple[ModelVersion, ModelExport]:
    """A readable version and its export in `fmt`, or `NotFoundError`."""
    target = model_registry.get_version(session=session, name=name, version=version, caller=caller)
    row = find(session=session, version_id=target.id, fmt=fmt)
    if row is None:
        raise NotFoundError(
            f"{name}/{version} has no {fmt} export yet; POST its exports with "
            f'{{"format": "{fmt}"}} to make it'
        )
    return target, row


class ExportsBusyError(Exception):
    """Too many exports are being made for the caller's key now; try again later."""


def create(
    *,
    session: Session,
    settings: Settings,
    name: str,
    version: int,
    fmt: export.Format,
    caller: Caller,
    int8: quantize.Int8Options | None = None,
) -> tuple[ModelExport, bool]:
    """The version's export in `fmt`, and whether it was made now: the stored one as is, or
    one made, checked and stored (the model's owner or an admin key).

    The export runs in a process of its own (`training.exporter`), with no transaction
    open: the session is committed before it and after its row is added. One export of a
    version is made at a time, in any process: a second request waits for it, then finds
    it; a key makes `EXPORTS_PER_KEY` at most at once (`ExportsBusyError` past that).

    `ExportMismatchError` when the export is farther from the eager net than the bound (it
    is not kept); for onnx_int8 (calibrated and judged as `int8` says), `Int8OverBoundError`
    when its evaluation error is over the bound and `QuantizationDataError` when the run's
    data cannot be read; `ExportFailedError` when its process fails or runs out of time;
    `CheckpointError` or `StoreUnavailableError` from the checkpoint's fetch;
    `InvalidError` for a new export when the caller keeps its whole artifact budget."""
    target = _exportable(session, name, version, caller)
    found = find(session=session, version_id=target.id, fmt=fmt)
    if found is not None:
        return found, False
    usage.check_room(session=session, settings=settings, spec=None, owner=caller.owner)
    session.commit()  # nothing is held while this request waits for its turn
    with claims(settings.database_url) as held:
        _take_turn(held, settings, caller, target)
        target = _exportable(session, name, version, caller)  # deleted meanwhile: a 404
        found = find(session=session, version_id=target.id, fmt=fmt)
        if found is not None:
            return found, False
        session.commit()
        row = _made(settings, target, fmt, caller, int8)
        try:
            _exportable(session, name, version, caller)  # the model's row locked again
        except NotFoundError:  # the version was deleted meanwhile, with its exports' files
            delete_files(settings, target)
            raise
        session.add(row)
        session.commit()  # before the turn ends: the next in line finds this row
    session.refresh(row)  # as stored, as the next request reads it
    return row, True


def _exportable(session: Session, name: str, version: int, caller: Caller) -> ModelVersion:
    return model_registry.changeable_version(
        session=session, name=name, version=version, caller=caller, action="export versions of"
    )


def _take_turn(held: Claims, settings: Settings, caller: Caller, target: ModelVersion) -> None:
    """One of the key's `exports_per_key` turns (`ExportsBusyError` if none is free), then
    the version's turn, waiting for another export of it to end."""
    slots = range(settings.exports_per_key)
    if not any(held.take(f"export-key:{caller.owner}:{slot}") for slot in slots):
        raise ExportsBusyError(
            f"this key has {settings.exports_per_key} exports being made now "
            f"(EXPORTS_PER_KEY); try again when one ends"
        )
    if not held.take(f"export-version:{target.id}", wait_s=settings.export_timeout_s):
        raise ExportsBusyError(
            f"another export of this version has taken over {settings.export_timeout_s:g} s; "
            "try again later"
        )


def _made(
    settings: Settings,
    target: ModelVersion,
    fmt: export.Format,
    caller: Caller,
    int8: quantize.Int8Options | None,
) -> ModelExport:
    """The version's export in `fmt`, made in a process of its own, checked and stored; its
    row, not yet added."""
    checkpoint = artifacts.local_file(settings, target.path, target.sha256)
    object_key = layout.export_key(target.job_id, target.id, export.SUFFIXES[fmt])
    store = store_for(settings)
    with tempfile.TemporaryDirectory(prefix="export-") as folder:
        path = Path(folder) / Path(object_key).name
        checked = exporter.export_in_process(
            checkpoint,
            target.sha256,
            fmt,
            path,
            timeout_s=settings.export_timeout_s,
            tolerance=export.TOLERANCE,
            int8=exporter.Int8Request(
                int8 or quantize.Int8Options(), settings.data_dir, settings.allow_downloads
            ),
        )
        sha256, size = sha256_of(path), path.stat().st_size
        store.put(object_key, path, sha256)
    return ModelExport(
        version_id=target.id,
        format=fmt,
        path=store.ref(object_key),
        sha256=sha256,
        bytes=size,
        max_abs_diff=checked.max_abs_diff,
        tolerance=checked.tolerance,
        details=checked.details,
        owner_key_id=caller.owner,
    )


def int8_graph(settings: Settings, sha256: str) -> tuple[Path, str]:
    """The kept int8 graph of a version that serves the checkpoint `sha256`: its local file
    (fetched from a bucket first) and sha256; `CheckpointError` saying how to make one when
    no such version has one."""
    with session_scope(settings.database_url) as session:
        query = (
            select(ModelExport.path, ModelExport.sha256)
            .join(ModelVersion, ModelVersion.id == ModelExport.version_id)
            .where(ModelVersion.sha256 == sha256, ModelExport.format == "onnx_int8")
            .order_by(ModelExport.id)
        )
        found = session.execute(query).first()
        if found is None:
            raise CheckpointError(_no_int8_graph(session, sha256))
    path, digest = found
    return artifacts.local_file(settings, path, digest), digest


def _no_int8_graph(session: Session, sha256: str) -> str:
    """Why a checkpoint has no int8 graph to serve, and how to make one."""
    query = (
        select(RegisteredModel.name, ModelVersion.version)
        .join(ModelVersion, ModelVersion.model_id == RegisteredModel.id)
        .where(ModelVersion.sha256 == sha256)
        .order_by(ModelVersion.id)
    )
    version = session.execute(query).first()
    served = "PREDICT_BACKEND=onnxruntime_int8 serves a version's kept int8 graph"
    if version is None:
        return (
            f"{served}, and this checkpoint is no registered version; register it, then "
            'POST its exports with {"format": "onnx_int8"}'
        )
    name, number = version
    return (
        f"{served}, and {name}/{number} has none; make one with POST "
        f'{EXPORTS_ROUTE.format(name=name, version=number)} {{"format": "onnx_int8"}}'
    )


def delete_files(settings: Settings, version: ModelVersion) -> int:
    """Delete the files of a version's exports; how many.

    `StoreUnavailableError` when the store cannot be reached: the caller keeps the rows."""
    return store_for(settings).delete_prefix(layout.export_prefix(version.job_id, version.id))


def open_verified(settings: Settings, path: str, sha256: str) -> BinaryIO:
    """A row's stored file (a checkpoint, an export) opened at its start, once the open
    file's bytes match `sha256`: what a reader then streams is what was checked.

    `CheckpointError` when the file is missing or does not match; `StoreUnavailableError`
    when the object store cannot be reached now."""
    try:
        handle = artifacts.local_file(settings, path, sha256).open("rb")
    except FileNotFoundError:
        raise CheckpointError(f"{Path(path).name} is missing from the artifact store") from None
    digest = hashlib.sha256()
    while chunk := handle.read(READ_CHUNK):
        digest.update(chunk)
    if digest.hexdigest() != sha256:
        handle.close()
        raise CheckpointError(
            f"{Path(path).name} has sha256 {digest.hexdigest()}, not the {sha256} recorded "
            "for it; it was changed or damaged after it was written"
        )
    handle.seek(0)
    return handle

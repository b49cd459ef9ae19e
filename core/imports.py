"""Imported weights as registered versions: a file converted, stored, and registered.

An import makes a succeeded job of kind "import" (`core.kinds.imported`) whose one
checkpoint is the converted file, written to the artifact store as a worker's are (with
its sha256; put to the bucket with `ARTIFACT_STORE=s3`), and registers that checkpoint
as the model's next version, so everything that resolves versions serves it unchanged.
Keyword-only service functions over a caller-owned session (the caller commits).
"""

from __future__ import annotations

import hashlib
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Literal

import torch
from sqlalchemy import select
from sqlalchemy.orm import Session

import models
from core import artifacts, layout, model_registry
from core.db.tables import Checkpoint, Job, ModelVersion, RegisteredModel, utcnow
from core.errors import InvalidError
from core.jobs import add_event
from core.kinds.imported import ImportJobSpec
from core.owners import ANYONE, Caller, check_owner
from core.settings import Settings
from core.storage import store_for
from training import checkpoints, weights
from training.specs import ModelSpec

FILE = ("body", "file")


class TooLargeFileError(InvalidError):
    """A weights file over IMPORT_MAX_BYTES."""


@dataclass(frozen=True)
class ImportRequest:
    """What to import: the net the weights are for, its classes and preprocessing."""

    name: str
    architecture: str
    options: dict[str, Any]
    classes: tuple[str, ...] | None = None
    preprocessing: dict[str, Any] | None = None  # fields that differ from the default's
    format: weights.Format | Literal["auto"] = "auto"
    weights: str | None = None  # a torchvision weight enum (ALLOW_DOWNLOADS)


def check_target(*, session: Session, name: str, caller: Caller = ANYONE) -> None:
    """Refuse before any work a name that is not one, or a model another key owns."""
    if model_registry.NAME.fullmatch(name) is None:
        raise InvalidError(
            f"model name {name!r} must match {model_registry.NAME.pattern}", field=("path", "name")
        )
    model = session.scalar(select(RegisteredModel).where(RegisteredModel.name == name))
    if model is not None:
        check_owner(caller, model.owner_key_id, f"model {name!r}", "add versions to")


def receive(source: IO[bytes], target: Path, max_bytes: int) -> str:
    """Copy an uploaded file to `target` in chunks; its sha256, or `TooLargeFileError`."""
    digest, written = hashlib.sha256(), 0
    with target.open("wb") as sink:
        while chunk := source.read(1 << 20):
            written += len(chunk)
            if written > max_bytes:
                raise TooLargeFileError(
                    f"the weights file is larger than IMPORT_MAX_BYTES = {max_bytes:,} bytes",
                    field=FILE,
                )
            digest.update(chunk)
            sink.write(chunk)
    if written == 0:
        raise InvalidError("the weights file is empty", field=FILE)
    return digest.hexdigest()


def convert_file(
    path: Path, request: ImportRequest, *, file_name: str, sha256: str
) -> weights.Imported:
    """Read, map and check a received file (CPU work: seconds for a ResNet-50)."""
    try:
        models.resolve(request.architecture, **request.options)  # the zoo's message
        read = weights.read(path, request.format)
        return weights.convert(
            read,
            architecture=request.architecture,
            options=request.options,
            classes=request.classes,
            preprocessing=request.preprocessing,
            file_name=file_name,
            source_sha256=sha256,
        )
    except ValueError as error:  # a WeightsError, or the zoo refusing the net
        raise InvalidError(_first_line(error), field=FILE) from None


def convert_named(request: ImportRequest, settings: Settings) -> weights.Imported:
    """Download torchvision's named weights (ALLOW_DOWNLOADS) and convert them with their
    own transforms and categories."""
    assert request.weights is not None
    if not settings.allow_downloads:
        raise InvalidError(
            f"weights {request.weights!r} would be downloaded, and downloads are off "
            "(ALLOW_DOWNLOADS=false): send the weights file instead",
            field=("body", "weights"),
        )
    try:
        architecture, named = weights.named_weights(request.weights, request.architecture or None)
    except weights.WeightsError as error:
        raise InvalidError(str(error), field=("body", "weights")) from None
    state = torch.hub.load_state_dict_from_url(named.url, progress=False, check_hash=True)
    file = Path(torch.hub.get_dir()) / "checkpoints" / Path(named.url).name
    return weights.convert(
        weights.Weights(dict(state), "torchvision"),
        architecture=architecture,
        options={},
        classes=request.classes or tuple(named.meta["categories"]),
        preprocessing=weights.enum_preprocessing(named).to_record() | (request.preprocessing or {}),
        file_name=str(named),
        source_sha256=checkpoints.sha256_of(file),
    )


def store(
    *,
    session: Session,
    settings: Settings,
    request: ImportRequest,
    imported: weights.Imported,
    caller: Caller = ANYONE,
) -> ModelVersion:
    """Make the import's job and checkpoint, and register it as `request.name`'s next
    version (flushed, not committed); its files go again if anything after them fails."""
    job = _job_row(request, imported, caller)
    session.add(job)
    session.flush()
    try:
        session.add(_checkpoint_row(settings, job.id, imported))
        add_event(session=session, job_id=job.id, level="info", message=_said(imported))
        return model_registry.register(
            session=session, name=request.name, job_id=job.id, caller=caller
        )
    except BaseException:
        artifacts.delete_job(settings, job.id)
        artifacts.delete_job_objects(settings, job.id)
        raise


def _job_row(request: ImportRequest, imported: weights.Imported, caller: Caller) -> Job:
    """A succeeded job of kind import: its spec says what, its summary what was found."""
    facts, architecture = imported.facts, imported.facts["architecture"]
    spec = ImportJobSpec(
        kind="import",
        name=f"import {facts['file_name']}",
        model=ModelSpec(name=architecture, options=request.options),
        format=facts["format"],
        file_name=facts["file_name"][:300],
        weights=request.weights,
        classes=len(imported.checkpoint["data"]["classes"]),
    )
    now = utcnow()
    return Job(
        kind="import",
        status="succeeded",
        name=spec.name,
        tags=[],
        spec=spec.model_dump(mode="json"),
        model_name=architecture,
        model_family=models.parse_name(architecture).family,
        depth=models.resolve(architecture, **request.options).depth,
        dataset_name=imported.checkpoint["data"]["name"][:100],
        params=imported.params,
        summary=facts,
        attempt=0,
        max_attempts=0,
        owner_key_id=caller.owner,
        started_at=now,
        finished_at=now,
    )


def _checkpoint_row(
    settings: Settings, job_id: uuid.UUID, imported: weights.Imported
) -> Checkpoint:
    """The converted checkpoint written into the job's folder (and the bucket), as a row."""
    directory = artifacts.job_dir(settings, job_id) / checkpoints.DIRECTORY
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / checkpoints.BEST
    torch.save(imported.checkpoint, path.with_suffix(".partial"))
    path.with_suffix(".partial").replace(path)
    sha256, size = checkpoints.sha256_of(path), path.stat().st_size
    path.with_suffix(".sha256").write_text(f"{sha256}  {path.name}\n")
    key, store = layout.checkpoint_key(job_id, path.name), store_for(settings)
    store.put(key, path, sha256)  # the local store holds it there already
    return Checkpoint(
        job_id=job_id, step=0, epoch=0, path=store.ref(key), sha256=sha256, bytes=size, is_best=True
    )


def _said(imported: weights.Imported) -> str:
    """The import's line in its job's log."""
    facts = imported.facts
    checked = (
        f"; its outputs equal torchvision's within {facts['max_abs_diff']:.2g}"
        if facts["checked_against"]
        else ""
    )
    return (
        f"imported {facts['file_name']} ({facts['format']}, {facts['keys']} keys, sha256 "
        f"{facts['source_sha256'][:12]}...) as {facts['architecture']}{checked}"
    )


def _first_line(error: Exception) -> str:
    return str(error).splitlines()[0] if str(error) else type(error).__name__


def discard(path: Path) -> None:
    """Remove a received file or folder, if it is there."""
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)

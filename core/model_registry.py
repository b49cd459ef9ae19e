"""The model registry: named models, numbered versions (job checkpoints) and aliases.

A model reference (`REF` of `POST /predict`) is one of: a job id (its best checkpoint),
`name` (the latest version), `name/3` (version 3) or `name@production` (an alias).
Keyword-only service functions over a caller-owned session (the caller commits).
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from core import artifacts
from core.db.tables import Job, ModelAlias, ModelVersion, RegisteredModel, utcnow
from core.errors import ConflictError, InvalidError, NotFoundError
from core.kinds.base import registrable, trains
from core.owners import ANYONE, Caller, check_owner, check_visible

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")
ALIAS = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,63}")
MAX_VERSION = 2**31 - 1  # a version is a 32-bit integer column
_REF = re.compile(rf"(?P<name>{NAME.pattern})(?:/(?P<version>[0-9]+)|@(?P<alias>{ALIAS.pattern}))?")


@dataclass(frozen=True)
class Resolved:
    """What a model reference points at: a checkpoint file and the sha256 it must have."""

    ref: str
    job_id: uuid.UUID
    model: str | None
    version: int | None
    path: str
    sha256: str
    step: int
    owner_key_id: uuid.UUID | None = None  # the job's, or the registered model's

    def check_visible(self, caller: Caller) -> None:
        """`NotFoundError` when the caller may not read what the reference points at."""
        missing = (
            f"model {self.model!r} is not registered"
            if self.model
            else f"job {self.ref} does not exist"
        )
        check_visible(caller, self.owner_key_id, missing)


def fine_tuned_from(job: Job) -> dict[str, Any] | None:
    """The job (and version) a train job was fine-tuned from, as its spec pinned it."""
    init = job.spec.get("init") if trains(job.kind) else None
    pinned = init.get("resolved") if isinstance(init, dict) else None
    if not isinstance(pinned, dict) or pinned.get("job_id") is None:
        return None
    return {key: pinned.get(key) for key in ("job_id", "model", "version")}


def register(
    *,
    session: Session,
    name: str,
    job_id: uuid.UUID,
    checkpoint: str = "best",
    caller: Caller = ANYONE,
    max_versions: int | None = None,
) -> ModelVersion:
    """Add the next version of `name` (created on first use, owned by the caller) from a
    succeeded job; only the model's owner (or an admin key) adds to an existing model, only
    the job's owner (or an admin key) registers a job of an owner, and a job is at most
    `max_versions` versions (MAX_VERSIONS_PER_JOB; None: no bound)."""
    if NAME.fullmatch(name) is None:
        raise InvalidError(f"model name {name!r} must match {NAME.pattern}", field=("path", "name"))
    # Locked: concurrent registrations of one job count its versions one after another.
    job = session.get(Job, job_id, with_for_update=True)
    # An import job (`core.imports`) holds converted weights as its one checkpoint.
    if job is None or not registrable(job.kind) or not caller.sees(job.owner_key_id):
        raise InvalidError(
            f"job {job_id} is not a train job of this service", field=("body", "job")
        )
    # A version keeps its job from being deleted: another key's would pin it for good. A
    # job made with auth off has no owner to pin it from (admin keys delete any version).
    if job.owner_key_id is not None:
        check_owner(caller, job.owner_key_id, f"job {job_id}", "register")
    if job.status != "succeeded":
        raise ConflictError(f"job {job_id} is {job.status}; only succeeded jobs register")
    if max_versions is not None:
        _check_room(session, job_id, max_versions)
    row = artifacts.find_checkpoint(session=session, job_id=job_id, which=checkpoint)
    if row is None:
        raise InvalidError(
            f"job {job_id} has no {checkpoint} checkpoint", field=("body", "checkpoint")
        )
    model = _locked_model(session, name, caller)
    check_owner(caller, model.owner_key_id, f"model {name!r}", "add versions to")
    latest = session.scalar(
        select(func.max(ModelVersion.version)).where(ModelVersion.model_id == model.id)
    )
    version = ModelVersion(
        model_id=model.id,
        version=(latest or 0) + 1,
        job_id=job_id,
        checkpoint=checkpoint,
        step=row.step,
        path=row.path,
        sha256=row.sha256,
        owner_key_id=caller.owner,
    )
    session.add(version)
    session.flush()
    return version


def _check_room(session: Session, job_id: uuid.UUID, max_versions: int) -> None:
    """`ConflictError` when the job is `max_versions` registered versions already."""
    made = session.execute(
        select(RegisteredModel.name, ModelVersion.version)
        .join(ModelVersion, ModelVersion.model_id == RegisteredModel.id)
        .where(ModelVersion.job_id == job_id)
        .order_by(ModelVersion.id)
    ).all()
    if len(made) >= max_versions:
        named = ", ".join(f"{name}/{version}" for name, version in made[:5])
        raise ConflictError(
            f"job {job_id} is {len(made)} registered versions already ({named}), the most "
            f"MAX_VERSIONS_PER_JOB ({max_versions}) allows; delete one of them first"
        )


def _locked_model(session: Session, name: str, caller: Caller) -> RegisteredModel:
    """The model `name`, made now if new, locked to the end of the transaction: concurrent
    registrations of one name create it once and number their versions one after another."""
    insert = postgresql.insert if session.get_bind().dialect.name == "postgresql" else sqlite.insert
    session.execute(
        insert(RegisteredModel)
        .values(name=name, owner_key_id=caller.owner, created_at=utcnow())
        .on_conflict_do_nothing(index_elements=["name"])
    )
    query = select(RegisteredModel).where(RegisteredModel.name == name).with_for_update()
    return session.scalars(query).one()


def set_alias(
    *, session: Session, name: str, alias: str, version: int, caller: Caller = ANYONE
) -> ModelAlias:
    """Point `alias` at a version; moving it switches traffic for the next request."""
    if ALIAS.fullmatch(alias) is None:
        raise InvalidError(f"alias {alias!r} must match {ALIAS.pattern}", field=("path", "alias"))
    _changeable(session, name, caller, "move aliases of")
    target = _version(session, name, version)
    row = session.get(ModelAlias, (target.model_id, alias))
    if row is None:
        row = ModelAlias(model_id=target.model_id, alias=alias, version_id=target.id)
        session.add(row)
    else:
        row.version_id = target.id
    session.flush()
    return row


def delete_alias(*, session: Session, name: str, alias: str, caller: Caller = ANYONE) -> None:
    """Remove an alias."""
    model = _changeable(session, name, caller, "remove aliases of")
    row = session.get(ModelAlias, (model.id, alias))
    if row is None:
        raise NotFoundError(f"model {name!r} has no alias {alias!r}")
    session.delete(row)


def delete_version(
    *, session: Session, name: str, version: int, caller: Caller = ANYONE
) -> ModelVersion:
    """Remove a version that no alias points to; the removed row (its exports' files are the
    caller's to delete, `core.exports.delete_files`). The model's owner, an admin key, or
    the owner of the version's job (whose job it keeps from being deleted) removes it."""
    target = _of_callers_job(session, name, version, caller)
    if target is None:
        _changeable(session, name, caller, "delete versions of")
        target = _version(session, name, version)
    aliases = session.scalars(select(ModelAlias.alias).where(ModelAlias.version_id == target.id))
    pointing = sorted(aliases)
    if pointing:
        raise ConflictError(
            f"{name}/{version} is served by alias(es) {', '.join(pointing)}; move them first"
        )
    session.delete(target)
    return target


def _of_callers_job(
    session: Session, name: str, version: int, caller: Caller
) -> ModelVersion | None:
    """Version `version` of `name` (its model locked) if it is made of a job of the
    caller's key; else None (nothing said about what the caller may not read)."""
    if caller.owner is None:
        return None
    try:
        target = _version(session, name, version)
    except NotFoundError:
        return None
    job_owner = session.scalar(select(Job.owner_key_id).where(Job.id == target.job_id))
    if job_owner != caller.owner:
        return None
    _lock(session, target.model_id)
    return target


def resolve(*, session: Session, ref: str) -> Resolved:
    """The checkpoint a model reference points at, or why not (not found, conflict, invalid)."""
    try:
        job_id = uuid.UUID(ref)
    except ValueError:
        return _resolve_name(session, ref)
    job = session.get(Job, job_id)
    if job is None:
        raise NotFoundError(f"job {ref} does not exist")
    if job.status != "succeeded" or not trains(job.kind):
        raise ConflictError(
            f"job {ref} is a {job.status} {job.kind} job; predict needs a succeeded train job"
        )
    row = artifacts.find_checkpoint(session=session, job_id=job_id, which="best")
    if row is None:
        raise ConflictError(f"job {ref} has no best checkpoint")
    return Resolved(ref, job_id, None, None, row.path, row.sha256, row.step, job.owner_key_id)


def _resolve_name(session: Session, ref: str) -> Resolved:
    match = _REF.fullmatch(ref)
    if match is None:
        raise InvalidError(
            f"model reference {ref!r} must be a job id, name, name/VERSION or name@ALIAS"
        )
    name, number, alias = match["name"], match["version"], match["alias"]
    model = get_model(session=session, name=name)
    if alias is not None:
        row = session.get(ModelAlias, (model.id, alias))
        if row is None:
            raise NotFoundError(f"model {name!r} has no alias {alias!r}")
        version = session.get(ModelVersion, row.version_id)
    elif number is not None:
        version = _version(session, name, int(number))
    else:
        version = session.scalars(
            select(ModelVersion)
            .where(ModelVersion.model_id == model.id)
            .order_by(ModelVersion.version.desc())
            .limit(1)
        ).first()
    if version is None:
        raise NotFoundError(f"model {name!r} has no versions")
    return Resolved(
        ref,
        version.job_id,
        name,
        version.version,
        version.path,
        version.sha256,
        version.step,
        model.owner_key_id,
    )


def get_model(*, session: Session, name: str, caller: Caller = ANYONE) -> RegisteredModel:
    """The registered model called `name`, or `NotFoundError` (also when the caller may not
    read it)."""
    model = session.scalar(select(RegisteredModel).where(RegisteredModel.name == name))
    missing = f"model {name!r} is not registered"
    if model is None:
        raise NotFoundError(missing)
    check_visible(caller, model.owner_key_id, missing)
    return model


def get_version(
    *, session: Session, name: str, version: int, caller: Caller = ANYONE
) -> ModelVersion:
    """Version `version` of `name`, or `NotFoundError` (also when the caller may not read it)."""
    get_model(session=session, name=name, caller=caller)
    return _version(session, name, version)


def changeable_version(
    *, session: Session, name: str, version: int, caller: Caller, action: str
) -> ModelVersion:
    """Version `version` of `name` if the caller may `action` its model (the model's row
    locked to the end of the transaction); else 404 or `NotOwnedError`."""
    _changeable(session, name, caller, action)
    return _version(session, name, version)


def _changeable(session: Session, name: str, caller: Caller, action: str) -> RegisteredModel:
    """The model called `name` if the caller may `action` it; else 404 or `NotOwnedError`.

    Its row stays locked to the end of the transaction: concurrent changes of one model's
    versions and aliases go one after another, each seeing the one before.
    """
    model = get_model(session=session, name=name, caller=caller)
    check_owner(caller, model.owner_key_id, f"model {name!r}", action)
    _lock(session, model.id)
    return model


def _lock(session: Session, model_id: int) -> None:
    """Lock a model's row to the end of the transaction."""
    session.execute(
        select(RegisteredModel.id).where(RegisteredModel.id == model_id).with_for_update()
    )


def _version(session: Session, name: str, version: int) -> ModelVersion:
    model = get_model(session=session, name=name)
    if not 0 < version <= MAX_VERSION:  # past the column's integer: no such version
        raise NotFoundError(f"model {name!r} has no version {version}")
    row = session.scalar(
        select(ModelVersion).where(
            ModelVersion.model_id == model.id, ModelVersion.version == version
        )
    )
    if row is None:
        raise NotFoundError(f"model {name!r} has no version {version}")
    return row

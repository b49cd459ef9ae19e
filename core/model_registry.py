"""The model registry: named models, numbered versions (job checkpoints) and aliases.

A model reference (`REF` of `POST /predict`) is one of: a job id (its best checkpoint),
`name` (the latest version), `name/3` (version 3) or `name@production` (an alias).
Keyword-only service functions over a caller-owned session (the caller commits).

An alias may split its traffic between versions by weight (`{3: 90, 4: 10}`), keep each
caller on its version (sticky) and copy a share of it to a shadow version whose answers
are only compared. Its resolution carries that rollout once; the data plane chooses per
request (`serving.rollout`). Every change is a `ModelHistory` row (`history`).
"""

from __future__ import annotations

import dataclasses
import itertools
import re
import uuid
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import delete, func, or_, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from core import artifacts
from core.db.tables import (
    ApiKey,
    Job,
    ModelAlias,
    ModelAliasWeight,
    ModelHistory,
    ModelVersion,
    RegisteredModel,
    utcnow,
)
from core.errors import ConflictError, InvalidError, NotFoundError
from core.kinds.base import registrable, trains
from core.owners import ANYONE, Caller, check_owner, check_visible

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")
ALIAS = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,63}")
MAX_VERSION = 2**31 - 1  # a version is a 32-bit integer column
MAX_WEIGHTED = 10  # versions one alias splits its traffic between
MAX_WEIGHT = 1_000_000
_REF = re.compile(rf"(?P<name>{NAME.pattern})(?:/(?P<version>[0-9]+)|@(?P<alias>{ALIAS.pattern}))?")


@dataclasses.dataclass(frozen=True)
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
    # Through a weighted alias: its versions and weights, one of which serves each request.
    rollout: Rollout | None = None
    shadow: Shadow | None = None  # through an alias with a shadow: where copies go

    def check_visible(self, caller: Caller) -> None:
        """`NotFoundError` when the caller may not read what the reference points at."""
        missing = (
            f"model {self.model!r} is not registered"
            if self.model
            else f"job {self.ref} does not exist"
        )
        check_visible(caller, self.owner_key_id, missing)


@dataclasses.dataclass(frozen=True)
class Shadow:
    """A version that takes a copy of `percent` of an alias's traffic, never answering it."""

    target: Resolved
    percent: int


@dataclasses.dataclass(frozen=True)
class Rollout:
    """A weighted alias's versions (oldest first) and their cumulative weights: version
    `arms[i]` takes the hash points in `[bounds[i - 1], bounds[i])` of `[0, bounds[-1])`."""

    alias: str
    arms: tuple[Resolved, ...]
    bounds: tuple[int, ...]
    sticky: bool


@dataclasses.dataclass(frozen=True)
class AliasState:
    """An alias as the registry keeps it: its primary (greatest weight), every version's
    weight, stickiness and shadow (version, percent)."""

    alias: str
    version: int
    weights: dict[int, int]
    sticky: bool
    shadow: tuple[int, int] | None
    updated_at: datetime

    def described(self) -> dict[str, Any]:
        """The state as history records it (JSON: version numbers as strings)."""
        shadow = self.shadow
        return {
            "weights": {str(v): w for v, w in sorted(self.weights.items())},
            "sticky": self.sticky,
            "shadow": None if shadow is None else {"version": shadow[0], "percent": shadow[1]},
        }


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
    _record(session, model.id, "version.registered", caller, version=version.version,
            after={"job": str(job_id), "checkpoint": checkpoint})  # fmt: skip
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
    *,
    session: Session,
    name: str,
    alias: str,
    version: int | None = None,
    weights: Mapping[int, int] | None = None,
    sticky: bool = False,
    shadow: tuple[int, int] | None = None,
    caller: Caller = ANYONE,
) -> AliasState:
    """Set an alias's whole state in one change: one `version`, or `weights` per version
    (the greatest is its primary), whether a caller keeps its version, and a shadow
    (version, percent). Moving it switches traffic for the next request."""
    if ALIAS.fullmatch(alias) is None:
        raise InvalidError(f"alias {alias!r} must match {ALIAS.pattern}", field=("path", "alias"))
    split = _weights(version, weights)
    model = _changeable(session, name, caller, "move aliases of")
    rows = {number: _version(session, name, number) for number in sorted(split)}
    shadow_row = None if shadow is None else _shadow(session, name, split, shadow)
    before = _state(session, model.id, alias)
    primary = max(sorted(split), key=lambda number: split[number])  # a tie: the oldest
    row = session.get(ModelAlias, (model.id, alias))
    if row is None:
        row = ModelAlias(model_id=model.id, alias=alias, version_id=rows[primary].id)
        session.add(row)
    row.version_id = rows[primary].id
    row.sticky = sticky and len(split) > 1
    row.shadow_version_id = None if shadow_row is None else shadow_row.id
    row.shadow_percent = None if shadow is None else shadow[1]
    session.flush()
    _set_weights(session, model.id, alias, {rows[n].id: w for n, w in split.items()})
    after = _state(session, model.id, alias)
    assert after is not None
    _record(session, model.id, _change(before, after), caller, alias=alias, version=primary,
            before=before.described() if before else None, after=after.described())  # fmt: skip
    return after


def _weights(version: int | None, weights: Mapping[int, int] | None) -> dict[int, int]:
    """The alias's weight per version, from one version or from weights; 422 when wrong."""
    if (version is None) == (weights is None):
        raise InvalidError("send either version or weights", field=("body",))
    if weights is None:
        assert version is not None
        return {version: 100}
    if not 1 <= len(weights) <= MAX_WEIGHTED:
        raise InvalidError(
            f"weights name {len(weights)} versions; an alias splits between 1 and {MAX_WEIGHTED}",
            field=("body", "weights"),
        )
    for number, weight in weights.items():
        if not 0 < weight <= MAX_WEIGHT:
            raise InvalidError(
                f"the weight of version {number} is {weight}; a weight is an integer from 1 "
                f"to {MAX_WEIGHT:,} (a version without traffic is left out)",
                field=("body", "weights"),
            )
    return dict(weights)


def _shadow(
    session: Session, name: str, split: Mapping[int, int], shadow: tuple[int, int]
) -> ModelVersion:
    """The shadow's version row; 422 when it takes traffic already or its percent is off."""
    number, percent = shadow
    if not 1 <= percent <= 100:
        raise InvalidError(
            f"the shadow's percent is {percent}; it is from 1 to 100", field=("body", "shadow")
        )
    if number in split:
        raise InvalidError(
            f"version {number} serves through the alias already; a shadow is a version that "
            "takes no traffic",
            field=("body", "shadow"),
        )
    return _version(session, name, number)


def _set_weights(session: Session, model_id: int, alias: str, weights: dict[int, int]) -> None:
    """Replace the alias's weight rows (none for a single version)."""
    session.execute(
        delete(ModelAliasWeight).where(
            ModelAliasWeight.model_id == model_id, ModelAliasWeight.alias == alias
        )
    )
    if len(weights) > 1:
        session.add_all(
            ModelAliasWeight(model_id=model_id, alias=alias, version_id=v, weight=w)
            for v, w in weights.items()
        )
    session.flush()


def _change(before: AliasState | None, after: AliasState) -> str:
    """The history action of an alias change: what of its state changed."""
    if before is None:
        return "alias.created"
    changed = [
        kind
        for kind, differs in (
            ("moved" if len(after.weights) == 1 else "weights", before.weights != after.weights),
            ("sticky", before.sticky != after.sticky),
            ("shadow", before.shadow != after.shadow),
        )
        if differs
    ]
    return "alias." + ("+".join(changed) or "unchanged")


def promote(
    *, session: Session, name: str, alias: str, version: int, caller: Caller = ANYONE
) -> AliasState:
    """The alias now serves `version` alone (its shadow cleared); `version` must be one of
    its weighted versions or its shadow (409 otherwise: move the alias instead)."""
    model = _changeable(session, name, caller, "promote aliases of")
    before = _state(session, model.id, alias)
    if before is None:
        raise NotFoundError(f"model {name!r} has no alias {alias!r}")
    candidates = set(before.weights) | ({before.shadow[0]} if before.shadow else set())
    if version not in candidates:
        raise ConflictError(
            f"version {version} is not in {name}@{alias} (its versions: "
            f"{', '.join(map(str, sorted(candidates)))}); point the alias at it with "
            "PUT .../aliases/{alias} instead"
        )
    target = _version(session, name, version)
    row = session.get(ModelAlias, (model.id, alias))
    assert row is not None
    row.version_id, row.sticky = target.id, False
    row.shadow_version_id = row.shadow_percent = None
    session.flush()
    _set_weights(session, model.id, alias, {})
    after = _state(session, model.id, alias)
    assert after is not None
    _record(session, model.id, "alias.promoted", caller, alias=alias, version=version,
            before=before.described(), after=after.described())  # fmt: skip
    return after


def delete_alias(*, session: Session, name: str, alias: str, caller: Caller = ANYONE) -> None:
    """Remove an alias."""
    model = _changeable(session, name, caller, "remove aliases of")
    before = _state(session, model.id, alias)
    row = session.get(ModelAlias, (model.id, alias))
    if row is None or before is None:
        raise NotFoundError(f"model {name!r} has no alias {alias!r}")
    session.delete(row)
    _record(session, model.id, "alias.deleted", caller, alias=alias, version=before.version,
            before=before.described())  # fmt: skip


def delete_version(
    *, session: Session, name: str, version: int, caller: Caller = ANYONE
) -> ModelVersion:
    """Remove a version that no alias serves or shadows; the removed row (its exports'
    files are the caller's to delete, `core.exports.delete_files`). The model's owner, an
    admin key, or the owner of the version's job (whose job it keeps from being deleted)
    removes it."""
    target = _of_callers_job(session, name, version, caller)
    if target is None:
        _changeable(session, name, caller, "delete versions of")
        target = _version(session, name, version)
    pointing = _aliases_using(session, target)
    if pointing:
        raise ConflictError(
            f"{name}/{version} is served by alias(es) {', '.join(pointing)}; move them first"
        )
    session.delete(target)
    _record(session, target.model_id, "version.deleted", caller, version=version,
            before={"job": str(target.job_id), "checkpoint": target.checkpoint})  # fmt: skip
    return target


def _aliases_using(session: Session, target: ModelVersion) -> list[str]:
    """The aliases that serve `target` (as primary or by weight) or shadow it, by name."""
    direct = session.scalars(
        select(ModelAlias.alias).where(
            ModelAlias.model_id == target.model_id,
            or_(ModelAlias.version_id == target.id, ModelAlias.shadow_version_id == target.id),
        )
    )
    weighted = session.scalars(
        select(ModelAliasWeight.alias).where(ModelAliasWeight.version_id == target.id)
    )
    return sorted({*direct, *weighted})


def history(
    *, session: Session, name: str, caller: Caller = ANYONE, limit: int = 100
) -> list[ModelHistory]:
    """The model's registry changes, newest first."""
    model = get_model(session=session, name=name, caller=caller)
    return list(
        session.scalars(
            select(ModelHistory)
            .where(ModelHistory.model_id == model.id)
            .order_by(ModelHistory.id.desc())
            .limit(limit)
        )
    )


def aliases_of(*, session: Session, model_ids: list[int]) -> dict[int, list[AliasState]]:
    """Every alias of the models, in name order, read in three queries for all of them."""
    query = select(ModelVersion.id, ModelVersion.version).where(
        ModelVersion.model_id.in_(model_ids)
    )
    numbers = {version_id: number for version_id, number in session.execute(query)}
    weights: dict[tuple[int, str], dict[int, int]] = {}
    for row in session.scalars(
        select(ModelAliasWeight).where(ModelAliasWeight.model_id.in_(model_ids))
    ):
        weights.setdefault((row.model_id, row.alias), {})[numbers[row.version_id]] = row.weight
    found: dict[int, list[AliasState]] = {model_id: [] for model_id in model_ids}
    for alias in session.scalars(
        select(ModelAlias).where(ModelAlias.model_id.in_(model_ids)).order_by(ModelAlias.alias)
    ):
        found[alias.model_id].append(_alias_state(alias, numbers, weights))
    return found


def _alias_state(
    row: ModelAlias, numbers: Mapping[int, int], weights: Mapping[tuple[int, str], dict[int, int]]
) -> AliasState:
    primary = numbers[row.version_id]
    split = weights.get((row.model_id, row.alias)) or {primary: 100}
    shadow = (
        None
        if row.shadow_version_id is None or row.shadow_percent is None
        else (numbers[row.shadow_version_id], row.shadow_percent)
    )
    return AliasState(row.alias, primary, split, row.sticky, shadow, row.updated_at)


def _state(session: Session, model_id: int, alias: str) -> AliasState | None:
    """One alias's state now, or None when the model has no such alias."""
    return next(
        (
            s
            for s in aliases_of(session=session, model_ids=[model_id])[model_id]
            if s.alias == alias
        ),
        None,
    )


def _record(
    session: Session,
    model_id: int,
    action: str,
    caller: Caller,
    *,
    alias: str | None = None,
    version: int | None = None,
    before: dict[str, Any] | None = None,
    after: dict[str, Any] | None = None,
) -> None:
    """Add a history row of a registry change, with the caller's key (its id and name)."""
    key_id = caller.owner
    key_name = (
        None if key_id is None else session.scalar(select(ApiKey.name).where(ApiKey.id == key_id))
    )
    session.add(
        ModelHistory(
            model_id=model_id,
            action=action,
            alias=alias,
            version=version,
            before=before,
            after=after,
            key_id=key_id,
            key_name=key_name,
        )
    )
    session.flush()


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
        return _resolve_alias(session, ref, model, alias)
    version: ModelVersion | None
    if number is not None:
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
    return _resolved(ref, model, version)


def _resolved(
    ref: str, model: RegisteredModel, version: ModelVersion, shadow: Shadow | None = None
) -> Resolved:
    return Resolved(
        ref,
        version.job_id,
        model.name,
        version.version,
        version.path,
        version.sha256,
        version.step,
        model.owner_key_id,
        shadow=shadow,
    )


def _resolve_alias(session: Session, ref: str, model: RegisteredModel, alias: str) -> Resolved:
    """An alias's primary version, with its rollout (weighted versions) and shadow if any."""
    row = session.get(ModelAlias, (model.id, alias))
    if row is None:
        raise NotFoundError(f"model {model.name!r} has no alias {alias!r}")
    shadow = None
    if row.shadow_version_id is not None and row.shadow_percent is not None:
        copied = session.get(ModelVersion, row.shadow_version_id)
        assert copied is not None  # the foreign key keeps it
        shadow = Shadow(
            _resolved(f"{model.name}/{copied.version}", model, copied), row.shadow_percent
        )
    primary = session.get(ModelVersion, row.version_id)
    assert primary is not None
    weighted = session.execute(
        select(ModelVersion, ModelAliasWeight.weight)
        .join(ModelAliasWeight, ModelAliasWeight.version_id == ModelVersion.id)
        .where(ModelAliasWeight.model_id == model.id, ModelAliasWeight.alias == alias)
        .order_by(ModelVersion.version)
    ).all()
    if len(weighted) < 2:
        return _resolved(ref, model, primary, shadow)
    arms = tuple(_resolved(ref, model, version, shadow) for version, _ in weighted)
    bounds = tuple(itertools.accumulate(weight for _, weight in weighted))
    rollout = Rollout(alias, arms, bounds, row.sticky)
    return dataclasses.replace(_resolved(ref, model, primary, shadow), rollout=rollout)


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

"""The model registry: named models whose versions are job checkpoints, and their aliases."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Annotated

from fastapi import APIRouter, Body, Query, Request, status
from sqlalchemy import select
from sqlalchemy.orm import Session

from api.deps import ReadCaller, RefsDep, SessionDep, SettingsDep, TrainCaller, Version
from api.errors import responses
from api.schemas import (
    AliasIn,
    AliasOut,
    HistoryOut,
    PromoteIn,
    RegisteredModelOut,
    RegisteredModelPage,
    RegisterIn,
    RegistryQuery,
    ShadowComparisonOut,
    ShadowOut,
    VersionOut,
)
from core import exports, kinds, listing, model_registry
from core.db.tables import Job, ModelVersion, RegisteredModel
from serving import rollout
from serving.cache import RefCache

router = APIRouter(prefix="/registry", tags=["registry"])


@router.get("", summary="Registered models", responses=responses(401, 403, 422))
def list_models(
    params: Annotated[RegistryQuery, Query()], session: SessionDep, caller: ReadCaller
) -> RegisteredModelPage:
    """A page of models in name order, each with its versions (job, dataset, test error,
    params, sha256) and aliases; `q` keeps the names that contain it. With
    READS_OWNER_ONLY, the caller's own models."""
    query = select(RegisteredModel)
    if params.q:
        query = query.where(RegisteredModel.name.icontains(params.q, autoescape=True))
    page, next_cursor = listing.page(
        session=session,
        query=query,
        order=BY_NAME,
        caller=caller,
        owner=RegisteredModel.owner_key_id,
        limit=params.limit,
        cursor=params.cursor,
    )
    return RegisteredModelPage(items=_described(session, page), next_cursor=next_cursor)


BY_NAME = listing.Order("name", (listing.Key("name", RegisteredModel.name, "text"),), noun="model")


@router.get("/{name}", summary="A registered model", responses=responses(401, 403, 404, 422))
def read_model(name: str, session: SessionDep, caller: ReadCaller) -> RegisteredModelOut:
    """The model's versions and aliases."""
    model = model_registry.get_model(session=session, name=name, caller=caller)
    return _described(session, [model])[0]


@router.post(
    "/{name}/versions",
    status_code=status.HTTP_201_CREATED,
    summary="Register a job's checkpoint as the next version",
    responses=responses(401, 403, 404, 409, 422),
)
def register_version(
    name: str,
    body: Annotated[RegisterIn, Body()],
    session: SessionDep,
    settings: SettingsDep,
    refs: RefsDep,
    caller: TrainCaller,
) -> VersionOut:
    """Add a succeeded train job's best or last checkpoint; the model is created on first use,
    owned by the caller's key, and only that key (or an admin key) adds versions later.

    Only the job's owner (or an admin key) registers it (403); a job is at most
    MAX_VERSIONS_PER_JOB versions (409)."""
    version = model_registry.register(
        session=session,
        name=name,
        job_id=body.job,
        checkpoint=body.checkpoint,
        caller=caller,
        max_versions=settings.max_versions_per_job,
    )
    _committed(session, refs)  # `name` now means this version
    job = session.get(Job, version.job_id)
    assert job is not None  # the foreign key keeps it
    return _version_out(version, job)


@router.put(
    "/{name}/aliases/{alias}",
    summary="Set an alias: one version, or weights per version, sticky, a shadow",
    responses=responses(401, 403, 404, 422),
)
def set_alias(
    name: str,
    alias: str,
    body: Annotated[AliasIn, Body()],
    session: SessionDep,
    refs: RefsDep,
    caller: TrainCaller,
) -> AliasOut:
    """Create or move an alias; the next prediction through it uses the new state.

    The body is the alias's whole state: `version`, or `weights` (version -> integer > 0,
    at most 10 versions; each version's share of the requests), `sticky` (a caller, by
    its API key or X-Session-Key, keeps its version while the weights hold) and `shadow`
    (a version that takes a copy of `percent` of the requests, its answers compared and
    never returned). What is not sent is reset. A version that does not exist is a 404.
    Only the model's owner (or an admin key) moves its aliases (403)."""
    shadow = None if body.shadow is None else (body.shadow.version, body.shadow.percent)
    state = model_registry.set_alias(
        session=session,
        name=name,
        alias=alias,
        version=body.version,
        weights=body.weights,
        sticky=body.sticky,
        shadow=shadow,
        caller=caller,
    )
    _committed(session, refs)
    return _alias_out(state)


@router.post(
    "/{name}/aliases/{alias}/promote",
    summary="Serve one version of the alias alone",
    responses=responses(401, 403, 404, 409, 422),
)
def promote(
    name: str,
    alias: str,
    body: Annotated[PromoteIn, Body()],
    session: SessionDep,
    refs: RefsDep,
    caller: TrainCaller,
) -> AliasOut:
    """The alias serves `version` alone from now on (weight 100, its shadow cleared).

    `version` is one of the alias's weighted versions or its shadow; another is a 409
    (move the alias with PUT instead)."""
    state = model_registry.promote(
        session=session, name=name, alias=alias, version=body.version, caller=caller
    )
    _committed(session, refs)
    return _alias_out(state)


@router.get(
    "/{name}/history",
    summary="The model's registry changes",
    responses=responses(401, 403, 404, 422),
)
def history(
    name: str,
    session: SessionDep,
    caller: ReadCaller,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> list[HistoryOut]:
    """Newest first: versions registered and deleted, aliases set, weighted, shadowed,
    promoted and removed; who (the key's id and name), when, and before -> after."""
    rows = model_registry.history(session=session, name=name, caller=caller, limit=limit)
    return [
        HistoryOut(
            action=row.action,
            alias=row.alias,
            version=row.version,
            before=row.before,
            after=row.after,
            key_id=row.key_id,
            key_name=row.key_name,
            at=row.created_at,
        )
        for row in rows
    ]


@router.delete(
    "/{name}/aliases/{alias}",
    status_code=status.HTTP_204_NO_CONTENT,
    summary="Remove an alias",
    responses=responses(401, 403, 404, 422),
)
def delete_alias(
    name: str, alias: str, session: SessionDep, refs: RefsDep, caller: TrainCaller
) -> None:
    """Predictions through `name@alias` answer 404 from now on (the model's owner or admin)."""
    model_registry.delete_alias(session=session, name=name, alias=alias, caller=caller)
    _committed(session, refs)


@router.delete(
    "/{name}/versions/{version}",
    status_code=status.HTTP_204_NO_CONTENT,
    summary="Remove a version no alias points to",
    responses=responses(401, 403, 404, 409, 422, 503),
)
def delete_version(
    name: str,
    version: Version,
    session: SessionDep,
    settings: SettingsDep,
    refs: RefsDep,
    caller: TrainCaller,
) -> None:
    """Remove the version and its exports (its job and checkpoint stay); 409 while an alias
    points to it.

    The model's owner, an admin key, or the owner of the version's job deletes it (403)."""
    removed = model_registry.delete_version(
        session=session, name=name, version=version, caller=caller
    )
    # Files go before the rows commit: an unreachable store is a 503 that keeps both.
    exports.delete_files(settings, removed)
    _committed(session, refs)


@router.get(
    "/{name}/shadow",
    summary="Shadow versions against the versions they copy",
    responses=responses(401, 403, 404, 422),
)
def shadow(
    name: str, request: Request, session: SessionDep, caller: ReadCaller
) -> list[ShadowComparisonOut]:
    """Per (served version, shadow version) of this API process: images compared, top-1
    agreement, mean |p difference|, the shadow's latency, copies dropped and failed."""
    model_registry.get_model(session=session, name=name, caller=caller)
    tap = rollout.shadow_tap(request.state.plane)
    figures = tap.figures(name) if tap is not None else []
    return [
        ShadowComparisonOut.model_validate(
            {"version": _number(primary), "shadow": _number(copy)} | comparison.described()
        )
        for primary, copy, comparison in figures
    ]


def _number(label: str) -> int:
    """The version of a `name/version` label."""
    return int(label.rpartition("/")[2])


def _committed(session: Session, refs: RefCache) -> None:
    """Commit a registry write, then drop the resolved references of this app."""
    # After the commit: a prediction resolving meanwhile reads the new state, or is not kept.
    session.commit()
    refs.clear()


def _described(session: Session, models: Sequence[RegisteredModel]) -> list[RegisteredModelOut]:
    """Model rows with their versions and aliases, read in two queries for all of them."""
    ids = [model.id for model in models]
    versions: defaultdict[int, list[tuple[ModelVersion, Job]]] = defaultdict(list)
    for version, job in session.execute(
        select(ModelVersion, Job)
        .join(Job, Job.id == ModelVersion.job_id)
        .where(ModelVersion.model_id.in_(ids))
        .order_by(ModelVersion.version)
    ):
        versions[version.model_id].append((version, job))
    aliases = model_registry.aliases_of(session=session, model_ids=ids)
    return [
        RegisteredModelOut(
            name=model.name,
            owner=model.owner_key_id,
            created_at=model.created_at,
            versions=[_version_out(version, job) for version, job in versions[model.id]],
            aliases=[_alias_out(state) for state in aliases[model.id]],
        )
        for model in models
    ]


def _alias_out(state: model_registry.AliasState) -> AliasOut:
    """An alias's state as the API answers it."""
    shadow = (
        None
        if state.shadow is None
        else ShadowOut(version=state.shadow[0], percent=state.shadow[1])
    )
    return AliasOut(
        alias=state.alias,
        version=state.version,
        updated_at=state.updated_at,
        weights={str(version): weight for version, weight in sorted(state.weights.items())},
        sticky=state.sticky,
        shadow=shadow,
    )


def _version_out(version: ModelVersion, job: Job) -> VersionOut:
    """A version row with its job's model, dataset and results."""
    error = job.best_test_error if version.checkpoint == "best" else job.final_test_error
    return VersionOut.model_validate(
        {
            "version": version.version,
            "job_id": version.job_id,
            "checkpoint": version.checkpoint,
            "step": version.step,
            "sha256": version.sha256,
            "model": job.model_name,
            "dataset": job.dataset_name,
            "test_error": error,
            "params": job.params,
            "owner": version.owner_key_id,
            "created_at": version.created_at,
            "fine_tuned_from": model_registry.fine_tuned_from(job),
            "imported": None if kinds.get(job.kind).queued else job.summary,
        }
    )

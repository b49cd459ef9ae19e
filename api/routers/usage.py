"""Artifact usage: the bytes each owner's job files and exports take, against its budget."""

from __future__ import annotations

from fastapi import APIRouter

from api.deps import AdminKey, ReadCaller, SessionDep, SettingsDep
from api.errors import responses
from api.schemas import UsageOut
from core import usage
from core.usage import Usage

router = APIRouter(prefix="/usage", tags=["usage"])


@router.get("", summary="The caller's artifact usage", responses=responses(401, 403))
def own_usage(session: SessionDep, settings: SettingsDep, caller: ReadCaller) -> UsageOut:
    """The bytes the caller's key keeps as stored (with auth off, everyone's as one) and
    what is left of MAX_ARTIFACT_BYTES_PER_OWNER."""
    found = usage.of_owner(session=session, settings=settings, owner=caller.owner)
    session.commit()  # the figures of ended jobs measured just now
    return _out(found, None)


@router.get("/owners", summary="Every owner's artifact usage", responses=responses(401, 403))
def every_usage(session: SessionDep, settings: SettingsDep, _: AdminKey) -> list[UsageOut]:
    """Each owner's bytes as stored, largest first; admin scope only."""
    found = usage.every_owner(session=session, settings=settings)
    session.commit()
    return [_out(entry, name) for entry, name in found]


def _out(found: Usage, name: str | None) -> UsageOut:
    return UsageOut(
        owner=found.owner,
        name=name,
        job_bytes=found.job_bytes,
        export_bytes=found.export_bytes,
        bytes=found.bytes,
        jobs=found.jobs,
        limit_bytes=found.limit,
        left_bytes=found.left,
    )

"""Workers: the register of worker processes, alive or lost (read scope)."""

from __future__ import annotations

from fastapi import APIRouter

from api.deps import ReadKey, SessionDep, SettingsDep
from api.errors import responses
from api.schemas import WorkerOut
from core import workers

router = APIRouter(prefix="/workers", tags=["workers"])


@router.get("", summary="List the workers", responses=responses(401, 403))
def list_workers(session: SessionDep, settings: SettingsDep, _: ReadKey) -> list[WorkerOut]:
    """Every registered worker by name: devices, queues, current job, jobs done, and its
    state (`lost`: unseen for three leases; the reapers re-enqueue its jobs)."""
    seen = workers.listing(session=session, lease_seconds=settings.lease_seconds)
    return [WorkerOut.of(each) for each in seen]

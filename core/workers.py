"""The workers' register: each worker's main process writes its row at start, and a
heartbeat every reaper pass; its job process notes the job it runs and when it ends.

A worker unseen for `WORKER_LOST_AFTER_LEASES` leases is `lost` (its jobs' leases ran out
too, and the reapers re-enqueue them); a worker that stops cleanly takes its row away, and
one lost for `FORGET_AFTER` is forgotten.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from sqlalchemy import delete, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from core.db.tables import Worker, utcnow

# A worker unseen this many lease periods is `lost`; a heartbeat comes every third of a lease,
# so that is nine missed ones.
WORKER_LOST_AFTER_LEASES = 3
FORGET_AFTER = timedelta(days=7)  # a lost worker's row stays this long, for the record
State = Literal["alive", "lost"]


@dataclass(frozen=True)
class Seen:
    """A worker's row and whether it is alive."""

    worker: Worker
    state: State


def register(
    *,
    session: Session,
    name: str,
    host: str,
    pid: int,
    devices: list[str],
    queues: list[str],
) -> None:
    """Write the worker's row (a restarted worker of the same name takes over its row)."""
    now = utcnow()
    values = {
        "name": name,
        "host": host,
        "pid": pid,
        "devices": devices,
        "queues": queues,
        "current_job_id": None,
        "jobs_done": 0,
        "started_at": now,
        "last_seen_at": now,
    }
    insert = postgresql.insert if session.get_bind().dialect.name == "postgresql" else sqlite.insert
    statement = insert(Worker).values(values)
    changed = {key: statement.excluded[key] for key in values if key != "name"}
    session.execute(statement.on_conflict_do_update(index_elements=["name"], set_=changed))


def heartbeat(*, session: Session, name: str) -> bool:
    """Record that the worker's main process is alive now; False if it has no row."""
    statement = update(Worker).where(Worker.name == name).values(last_seen_at=utcnow())
    return bool(session.execute(statement.returning(Worker.name)).first())


def running(*, session: Session, name: str, job_id: uuid.UUID | None) -> None:
    """Note the job the worker runs now (None: none)."""
    session.execute(update(Worker).where(Worker.name == name).values(current_job_id=job_id))


def finished(*, session: Session, name: str) -> None:
    """Note that the worker's job ended: one more done, none running."""
    session.execute(
        update(Worker)
        .where(Worker.name == name)
        .values(current_job_id=None, jobs_done=Worker.jobs_done + 1)
    )


def deregister(*, session: Session, name: str) -> None:
    """Remove the row of a worker that stops cleanly."""
    session.execute(delete(Worker).where(Worker.name == name))


def forget_lost(*, session: Session, unseen_for: timedelta) -> int:
    """Remove the rows of workers unseen for `unseen_for` (gone for good); how many."""
    cutoff = utcnow() - unseen_for
    gone = session.execute(
        delete(Worker).where(Worker.last_seen_at < cutoff).returning(Worker.name)
    )
    return len(gone.all())


def state(worker: Worker, *, lease_seconds: int, now: datetime | None = None) -> State:
    """`lost` when unseen for `WORKER_LOST_AFTER_LEASES` leases, else `alive`."""
    cutoff = (now or utcnow()) - timedelta(seconds=WORKER_LOST_AFTER_LEASES * lease_seconds)
    return "alive" if _aware(worker.last_seen_at) >= cutoff else "lost"


def listing(*, session: Session, lease_seconds: int) -> list[Seen]:
    """Every registered worker with its state, by name."""
    now = utcnow()
    rows = session.scalars(select(Worker).order_by(Worker.name))
    return [Seen(row, state(row, lease_seconds=lease_seconds, now=now)) for row in rows]


def serving(*, session: Session, queue: str, lease_seconds: int) -> int:
    """How many alive workers consume `queue`."""
    seen = listing(session=session, lease_seconds=lease_seconds)
    return sum(1 for each in seen if each.state == "alive" and queue in each.worker.queues)


def _aware(moment: datetime) -> datetime:
    # SQLite hands timestamps back without their zone; they are stored in UTC.
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=utcnow().tzinfo)

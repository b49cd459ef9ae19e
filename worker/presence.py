"""A worker's presence: its row in the register (`core.workers`), and which jobs it serves.

The main process registers at start (its devices as `resnet-service worker` chose them, its
queues as Celery consumes them) with its first heartbeat, beats every reaper pass and
leaves at a clean stop. The job process notes the job it runs, and refuses one that needs
more GPUs than it has: a message that reached the wrong queue goes back to its own.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from sqlalchemy.orm import Session

from core import resources, workers
from core.db.session import session_scope
from core.db.tables import FINAL_STATUSES, Job
from core.queue import enqueue_committed
from core.resources import ResourcesSpec
from core.settings import Settings
from training.devices import default_device

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Presence:
    """This worker in the register: its Celery node name, the queues it consumes and the
    devices it owns."""

    settings: Settings
    name: str
    queues: list[str]
    devices: list[str]

    def beat(self) -> None:
        """The main process's heartbeat (each reaper pass); writes the row when missing, and
        forgets workers lost for long."""
        with session_scope(self.settings.database_url, pooled=False) as session:
            workers.forget_lost(session=session, unseen_for=workers.FORGET_AFTER)
            if workers.heartbeat(session=session, name=self.name):
                return
            workers.register(
                session=session,
                name=self.name,
                host=socket.gethostname(),
                pid=os.getpid(),
                devices=self.devices,
                queues=self.queues,
            )


def ordered(queues: Iterable[str]) -> list[str]:
    """Queue names in the order of need (cpu, gpu, gpu-2, ...), others after, by name."""
    known = {name: index for index, name in enumerate(resources.ALL_QUEUES)}
    return sorted(queues, key=lambda name: (known.get(name, len(known)), name))


def leave(settings: Settings, name: str) -> None:
    """Remove this worker's row (a clean stop); a failure only leaves it to turn `lost`."""
    try:
        with session_scope(settings.database_url, pooled=False) as session:
            workers.deregister(session=session, name=name)
    except Exception as error:
        log.warning("worker %s: could not leave the register: %s", name, error)


def needs(settings: Settings, job_id: uuid.UUID) -> ResourcesSpec | None:
    """What the job needs, from its stored spec; None when it is gone."""
    with session_scope(settings.database_url) as session:
        job = session.get(Job, job_id)
        return None if job is None else resources.of_spec(job.spec)


def gpus_here(settings: Settings) -> int:
    """The GPUs this job process may use: none when its device is the CPU."""
    device = settings.device or str(default_device())
    return torch.cuda.device_count() if device.startswith("cuda") else 0


def settings_for(settings: Settings, job_id: uuid.UUID) -> Settings | None:
    """The settings to run the job with (a `cpu` job runs on the CPU of a GPU worker), or None
    when this worker cannot serve it: then it is sent back to the queue of its needs."""
    needed = needs(settings, job_id)
    if needed is None:
        return settings  # the claim finds it gone
    if (needed.gpus or 0) > gpus_here(settings):
        log.warning("job %s needs %s: not taken here, re-enqueued", job_id, needed)
        enqueue_committed([job_id], settings=settings)
        return None
    if needed.device == "cpu":
        return settings.model_copy(update={"device": "cpu"})
    return settings


def job_started(settings: Settings, node: str, job_id: uuid.UUID) -> None:
    """Note the job this worker's job process runs now."""
    _quietly(
        settings, node, lambda session: workers.running(session=session, name=node, job_id=job_id)
    )


def job_ended(settings: Settings, node: str, job_id: uuid.UUID, worker: str) -> None:
    """Note that the delivery ended; count the job done when it ended here."""

    def note(session: Session) -> None:
        job = session.get(Job, job_id)
        ran_here = job is not None and job.worker == worker and job.status in FINAL_STATUSES
        if ran_here:
            workers.finished(session=session, name=node)
        else:
            workers.running(session=session, name=node, job_id=None)

    _quietly(settings, node, note)


def _quietly(settings: Settings, node: str, write: Callable[[Session], None]) -> None:
    # The register is for people to read: a job never fails for it.
    try:
        with session_scope(settings.database_url) as session:
            write(session)
    except Exception as error:
        log.warning("worker %s: could not update the register: %s", node, error)

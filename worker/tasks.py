"""The Celery tasks: thin wrappers that take a job id and hand it to `worker.runner`.

Run a worker with `resnet-service worker` (or `celery -A worker.tasks worker -Q train -c 1`):
one job at a time per process, one worker process per GPU. The reliability settings are in
`core/queue.py`; this module adds the tasks and, in the worker's main process, the reaper.

Stopping a worker with SIGTERM (`docker compose stop`) hands its running job back: the main
process passes the signal on to the job process, which checkpoints, puts the job back in the
queue and enqueues it for another worker, then exits; Celery's warm shutdown waits for it.
"""

from __future__ import annotations

import os
import signal
import uuid
from contextlib import suppress
from typing import Any

from billiard import process  # type: ignore[import-untyped]
from celery import signals

from core.db import schema
from core.db.session import get_engine
from core.queue import REAP, RUN_JOB, app_for
from core.settings import get_settings
from worker import presence, reaper, runner
from worker.watchdog import SHUTTING_DOWN

settings = get_settings()
app = app_for(settings)
_reaper = reaper.Reaper(settings)


def run_job(task: Any, job_id: str) -> None:
    """Claim the job and run it to its outcome; a delivery that cannot claim does nothing,
    and one this worker cannot serve (it needs more GPUs) goes back to its queue.

    SIGTERM meanwhile asks the job to checkpoint and go back to the queue.
    """
    node, job = task.request.hostname, uuid.UUID(job_id)
    worker = f"{node} pid {os.getpid()}"
    job_settings = presence.settings_for(settings, job)
    if job_settings is None:
        return
    # Here, not at the process's start: billiard installs its own handlers after that.
    previous = signal.signal(signal.SIGTERM, lambda *_: SHUTTING_DOWN.set())
    presence.job_started(settings, node, job)
    try:
        runner.execute(job, settings=job_settings, worker=worker)
    finally:
        signal.signal(signal.SIGTERM, previous)
        presence.job_ended(settings, node, job, worker)


def reap_expired() -> int:
    """One reaper pass, for Celery beat users (each worker already runs a reaper thread)."""
    return len(reaper.reap_once(settings))


def _refuse_old_schema(**_: object) -> None:
    """Stop the worker at start when the database is not at the code's migration head."""
    try:
        schema.check_current(settings.database_url)
    except schema.SchemaOutdated as error:
        raise SystemExit(f"error: {error}") from None
    finally:
        # Children fork from this process: leave them no pooled connection to share.
        get_engine(settings.database_url).dispose()


def _start_reaper(sender: Any, **_: object) -> None:
    """In the main process, once ready: start the reaper, whose passes begin with this
    worker's heartbeat in the register (the first writes its row)."""
    consumed = presence.ordered(sender.app.amqp.queues.consume_from)
    _reaper.beat = presence.Presence(settings, sender.hostname, consumed).beat
    _reaper.start()


def _stop_reaper(sender: Any, **_: object) -> None:
    """At shutdown: stop the reaper, then leave the register (a stopped worker is not lost)."""
    _reaper.stop()
    presence.leave(settings, sender.hostname)


def _pass_on_shutdown(sender: str, how: str = "Warm", **_: object) -> None:
    """In the main process, at a warm or cold shutdown: tell the job processes (SIGTERM);
    a cold one leaves the register now (it ends with no worker_shutdown)."""
    for child in process.active_children():
        with suppress(ProcessLookupError):
            os.kill(child.pid, signal.SIGTERM)
    if how == "Cold":
        _reaper.stop_soon()
        presence.leave(settings, sender)


app.task(name=RUN_JOB, bind=True)(run_job)
app.task(name=REAP)(reap_expired)
signals.worker_init.connect(_refuse_old_schema, weak=False)
signals.worker_ready.connect(_start_reaper, weak=False)
signals.worker_shutdown.connect(_stop_reaper, weak=False)
signals.worker_shutting_down.connect(_pass_on_shutdown, weak=False)

"""The Celery tasks: thin wrappers that take a job id and hand it to `worker.runner`.

`create_worker_app(settings, devices)` builds a worker's app from the settings it is given:
the tasks, and the hooks of its main process (the schema check, the reaper, the register).
Run a worker with `resnet-service worker`, or `celery -A worker.tasks worker -Q cpu -c 1`
(the module's `app`, made on first use from the environment's settings): one job at a time
per process, one worker process per GPU. The reliability settings are in `core/queue.py`.

Stopping a worker with SIGTERM (`docker compose stop`) hands its running job back: the main
process passes the signal on to the job process, which checkpoints, puts the job back in the
queue and enqueues it for another worker, then exits; Celery's warm shutdown waits for it.
"""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Sequence
from contextlib import suppress
from functools import cache
from typing import Any

from billiard import process  # type: ignore[import-untyped]
from celery import Celery, signals

from core.db import schema
from core.db.session import get_engine
from core.queue import REAP, RUN_JOB, new_app
from core.settings import Settings, get_settings
from worker import presence, reaper, runner
from worker.watchdog import SHUTTING_DOWN


def create_worker_app(settings: Settings, devices: Sequence[str] = ("cpu",)) -> Celery:
    """A worker's Celery app, configured by `settings`, that registers `devices` as its own."""
    app = new_app(settings)

    def run(task: Any, job_id: str) -> None:
        """Claim the job and run it to its outcome (`run_job`)."""
        run_job(settings, task, job_id)

    def reap() -> int:
        """One reaper pass, for Celery beat users (each worker already runs a reaper thread)."""
        return len(reaper.reap_once(settings))

    app.task(name=RUN_JOB, bind=True)(run)
    app.task(name=REAP)(reap)
    _MainProcess(app, settings, list(devices)).connect()
    return app


def run_job(settings: Settings, task: Any, job_id: str) -> None:
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


class _MainProcess:
    """The hooks of a worker's main process, on Celery's worker signals; each acts only for
    the worker of its own app (signals are global to the process)."""

    def __init__(self, app: Celery, settings: Settings, devices: list[str]) -> None:
        self.app, self.settings, self.devices = app, settings, devices
        self.reaper = reaper.Reaper(settings)
        self.started = False

    def connect(self) -> None:
        """Connect each hook to its signal."""
        signals.worker_init.connect(self.refuse_old_schema, weak=False)
        signals.worker_ready.connect(self.start_reaper, weak=False)
        signals.worker_shutdown.connect(self.stop_reaper, weak=False)
        signals.worker_shutting_down.connect(self.pass_on_shutdown, weak=False)

    def refuse_old_schema(self, sender: Any, **_: object) -> None:
        """Stop the worker at start when the database is not at the code's migration head."""
        if sender.app is not self.app:
            return
        self.started = True
        try:
            schema.check_current(self.settings.database_url)
        except schema.SchemaOutdated as error:
            raise SystemExit(f"error: {error}") from None
        finally:
            # Children fork from this process: leave them no pooled connection to share.
            get_engine(self.settings.database_url).dispose()

    def start_reaper(self, sender: Any, **_: object) -> None:
        """Once ready: start the reaper, whose passes begin with this worker's heartbeat in
        the register (the first writes its row)."""
        if sender.app is not self.app:
            return
        consumed = presence.ordered(sender.app.amqp.queues.consume_from)
        here = presence.Presence(self.settings, sender.hostname, consumed, self.devices)
        self.reaper.beat = here.beat
        self.reaper.start()

    def stop_reaper(self, sender: Any, **_: object) -> None:
        """At shutdown: stop the reaper, then leave the register (a stopped worker is not
        lost)."""
        if sender.app is not self.app:
            return
        self.reaper.stop()
        presence.leave(self.settings, sender.hostname)

    def pass_on_shutdown(self, sender: str, how: str = "Warm", **_: object) -> None:
        """At a warm or cold shutdown: tell the job processes (SIGTERM); a cold one leaves
        the register now (it ends with no worker_shutdown)."""
        if not self.started:
            return
        for child in process.active_children():
            with suppress(ProcessLookupError):
                os.kill(child.pid, signal.SIGTERM)
        if how == "Cold":
            self.reaper.stop_soon()
            presence.leave(self.settings, sender)


@cache
def _environment_app() -> Celery:
    return create_worker_app(get_settings())


def __getattr__(name: str) -> Celery:
    """`app`, for `celery -A worker.tasks`: the worker app of the environment's settings."""
    if name == "app":
        return _environment_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

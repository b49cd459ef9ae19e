"""The worker's Celery app: made from the settings it is given, or lazily for `celery -A`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from core import queue
from core.queue import REAP, RUN_JOB
from core.settings import Settings
from worker.tasks import create_worker_app


def _settings(root: Path) -> Settings:
    return Settings(
        database_url=f"sqlite:///{root / 'service.db'}",
        broker_url=f"sqla+sqlite:///{root / 'broker.db'}",
        lease_seconds=7,
    )


def test_a_worker_app_is_made_from_the_settings_it_is_given(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    app = create_worker_app(settings, ["cuda:0"])
    assert {RUN_JOB, REAP} <= set(app.tasks)
    assert app.conf.broker_url == settings.broker_url
    assert app.conf.beat_schedule["reap-expired"]["schedule"] == 7.0
    assert app.conf.task_acks_late
    assert app.conf.worker_prefetch_multiplier == 1
    assert app is not queue.app_for(settings)  # the sender of this process stays apart
    assert create_worker_app(settings) is not app


def test_the_celery_command_finds_the_app_of_the_environments_settings(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    env = {**os.environ, "BROKER_URL": settings.broker_url, "DATABASE_URL": settings.database_url}
    found = (
        "from celery.app.utils import find_app; import worker.tasks as tasks; "
        "assert 'app' not in vars(tasks); app = find_app('worker.tasks'); "
        "assert app is tasks.app; print(app.conf.broker_url, sorted(app.tasks))"
    )
    result = subprocess.run(
        [sys.executable, "-c", found], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(settings.broker_url)
    assert RUN_JOB in result.stdout
    assert REAP in result.stdout

"""`resnet-service worker --gpus`: GPUs split into worker processes, and their supervision
(signals passed on to every worker; one that exits stops the others warm)."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import typer
from sqlalchemy import select
from typer.testing import CliRunner

from cli import server
from cli.main import app
from core.db.session import session_scope
from core.db.tables import Job, Worker
from core.kinds import TrainJobSpec
from core.settings import get_settings
from tests.helpers import recipe, submit, wait_for, wait_status
from tests.services import make_settings, service_env

# A stand-in worker: says which signal ended it, as Celery's warm and cold shutdowns would.
CHILD = """
import signal, sys, time
def stop(number, _):
    open(sys.argv[1], "w").write(signal.Signals(number).name)
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGQUIT, stop)
open(sys.argv[1] + ".ready", "w").close()
time.sleep(int(sys.argv[2]))
sys.exit(int(sys.argv[3]))
"""


def test_gpus_split_into_groups_and_bad_choices_say_why() -> None:
    assert server.gpu_groups("all", 1, 2) == [[0], [1]]
    assert server.gpu_groups("1,3", 1, 4) == [[1], [3]]
    assert server.gpu_groups("all", 2, 4) == [[0, 1], [2, 3]]
    refusals = {
        ("all", 1, 0): "no GPU is visible on this machine",
        ("0,1", 1, 1): r"below 1 \(the GPUs visible here\), not 0,1",
        ("0,0", 1, 2): "must be distinct",
        ("x", 1, 2): "neither all nor GPU ids",
        ("all", 2, 3): "3 GPUs do not split into groups of 2",
    }
    for (gpus, per_worker, visible), message in refusals.items():
        with pytest.raises(typer.BadParameter, match=message):
            server.gpu_groups(gpus, per_worker, visible)


def test_the_worker_arguments_name_the_queues_served() -> None:
    argv = server.worker_argv("w@h", "INFO", ["cpu", "gpu", "gpu-2"])
    assert "--queues=cpu,gpu,gpu-2" in argv
    assert "--queues=cpu" in server.worker_argv("w@h", "INFO")


def _children(tmp_path: Path, *plans: tuple[int, int]) -> dict[str, subprocess.Popen[bytes]]:
    """Stand-in workers: each (seconds to live, exit status)."""
    started = {}
    for index, (seconds, status) in enumerate(plans):
        note = tmp_path / f"w{index}"
        args = [sys.executable, "-c", CHILD, str(note), str(seconds), str(status)]
        started[f"w{index}"] = subprocess.Popen(args, start_new_session=True)
        deadline = time.monotonic() + 30
        while not Path(f"{note}.ready").exists():
            assert time.monotonic() < deadline, "a stand-in worker did not start"
            time.sleep(0.05)
    return started


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGQUIT])
def test_a_signal_to_the_supervisor_reaches_every_worker(
    tmp_path: Path, sig: signal.Signals
) -> None:
    children = _children(tmp_path, (60, 0), (60, 0))
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGQUIT, signal.SIGINT)}
    timer = threading.Timer(0.5, lambda: signal.raise_signal(sig))
    timer.start()
    try:
        assert server.watch_workers(children) == 0
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
    assert [(tmp_path / f"w{i}").read_text() for i in range(2)] == [sig.name] * 2


def test_a_worker_that_fails_stops_the_others_warm(tmp_path: Path) -> None:
    children = _children(tmp_path, (0, 3), (60, 0))
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGQUIT, signal.SIGINT)}
    try:
        assert server.watch_workers(children) == 1
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
    assert (tmp_path / "w1").read_text() == "SIGTERM"


@pytest.mark.slow
def test_two_gpu_workers_register_run_a_cpu_job_and_stop_on_sigterm(
    postgres_url: str,
    redis_broker_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # This machine has no GPU: the supervisor is told it sees two. Its real workers start
    # (Celery needs no GPU until a job does) and a job that asks for the CPU runs on one.
    settings = make_settings(postgres_url, redis_broker_url, tmp_path)
    for key, value in service_env(settings, tmp_path / "artifacts").items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(server, "visible_gpus", lambda: 2)
    url = settings.database_url
    seen: dict[str, list[Worker]] = {}
    ended: list[Job] = []

    def drive() -> None:
        try:
            seen["workers"] = wait_for(lambda: _alive(url, 2), 300, "two workers to register")
            job_id = submit(settings, _cpu_job())
            ended.append(wait_status(url, job_id, "succeeded", timeout=180))
        finally:
            signal.raise_signal(signal.SIGTERM)  # to the supervisor, as `docker compose stop`

    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGQUIT, signal.SIGINT)}
    driver = threading.Thread(target=drive)
    driver.start()
    try:
        assert server.supervise_workers("all", 1, "w@%h", "INFO") == 0
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        driver.join()
    registered = {row.name.split("@")[0]: row for row in seen["workers"]}
    assert sorted(registered) == ["w-gpu0", "w-gpu1"]
    assert [registered["w-gpu1"].devices, registered["w-gpu1"].queues] == [
        ["cuda:1"],
        ["cpu", "gpu"],
    ]
    assert ended[0].device == "cpu"
    assert str(ended[0].worker).split("@")[0] in registered
    assert _alive(url, 0) == []  # both stopped warm and left the register


def _alive(url: str, count: int) -> list[Worker] | None:
    with session_scope(url) as session:
        rows = list(session.scalars(select(Worker).order_by(Worker.name)))
    return rows if len(rows) == count else None


def _cpu_job() -> TrainJobSpec:
    return TrainJobSpec.model_validate(
        {
            "model": {"name": "resnet8"},
            "dataset": {"name": "digits", "validation": 0},
            "recipe": recipe(1),
            "resources": {"device": "cpu"},
        }
    )


def test_a_cuda_device_where_no_gpu_is_visible_is_refused(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DATABASE_URL", postgres_url)
    monkeypatch.setenv("DEVICE", "cuda:0")  # as --device sets it, undone after the test
    get_settings.cache_clear()
    try:
        ran = CliRunner().invoke(app, ["worker"])
    finally:
        get_settings.cache_clear()
    assert ran.exit_code == 1
    assert "device cuda:0 is asked for, but no GPU is visible" in ran.output

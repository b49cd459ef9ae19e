"""`resnet-service up` on a bare folder: SQLite, the embedded broker, a worker and the API;
a job over HTTP; then SIGINT stops every process it started.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.helpers import recipe, wait_for
from tests.services import BIN, free_port

pytestmark = pytest.mark.slow

CONFIGURED = ("DATABASE_URL", "BROKER_URL", "ARTIFACT_DIR", "DATA_DIR", "AUTH_ENABLED")


def _descendants(pid: int) -> set[int]:
    """Every living process below `pid` (from /proc)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier}
        found |= frontier
    return found


def _alive(pid: int) -> bool:
    """Whether `pid` is a living process (neither gone nor a zombie)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.fixture
def up(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], str, Path]]:
    """`resnet-service up` in an empty folder, nothing configured but a short lease."""
    env = {key: value for key, value in os.environ.items() if key not in CONFIGURED}
    env |= {"LEASE_SECONDS": "6", "HEARTBEAT_SECONDS": "1", "OMP_NUM_THREADS": "1"}
    port = free_port()
    log = tmp_path / "up.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [str(BIN / "resnet-service"), "up", "--port", str(port)],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield process, f"http://127.0.0.1:{port}/api/v1", log
    finally:
        for pid in _descendants(process.pid) | {process.pid}:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        process.wait()


def test_up_serves_jobs_and_stops_cleanly_on_sigint(
    up: tuple[subprocess.Popen[bytes], str, Path], tmp_path: Path
) -> None:
    process, api, log = up
    wait_for(lambda: "ready: " in log.read_text() or process.poll() is not None, 120, "up")
    output = log.read_text()
    assert process.poll() is None, output
    assert "AUTH IS OFF" in output
    assert (tmp_path / "var" / "resnet.db").is_file()

    with httpx.Client(base_url=api, timeout=10) as client:
        body = {
            "kind": "train",
            "model": {"name": "resnet8"},
            "dataset": {"name": "digits", "validation": 0},
            "recipe": recipe(2),
        }
        created = client.post("/jobs", json=body)
        assert created.status_code == 202, created.text
        job_id = created.json()["id"]

        def status() -> str | None:
            current = str(client.get(f"/jobs/{job_id}").json()["status"])
            return current if current in ("succeeded", "failed", "cancelled") else None

        assert wait_for(status, 90, "the job to end") == "succeeded"
    assert (tmp_path / "var" / "broker.db").is_file()
    assert (tmp_path / "var" / "artifacts" / "jobs" / job_id / "checkpoints" / "best.pt").is_file()

    # The worker, its job process and the API. A job process ends after its job and the
    # worker starts the next one: count once it has.
    def running() -> set[int] | None:
        found = _descendants(process.pid)
        return found if len(found) >= 3 else None

    started = wait_for(running, 30, "the worker's next job process")
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=30) == 0
    assert not [pid for pid in started if _alive(pid)]

"""`cancel`, `retry`, `delete`, `register`, `download` and `workers` against a real HTTP
server on Postgres: each one's success, and the service's refusals as exit codes and
messages."""

from __future__ import annotations

import hashlib
import json
import socket
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import update
from typer.testing import CliRunner, Result

from cli.main import app
from client import Client
from core import workers
from core.db.session import session_scope
from core.db.tables import Job
from core.settings import Settings
from tests.helpers import Key, claim, job, key_of, new_job, trained_job

runner = CliRunner()
Invoke = Callable[..., Result]  # `resnet-service ARGS` against the module's service


@pytest.fixture(scope="module")
def key(settings: Settings) -> Key:
    return key_of(settings.database_url, "read", "train")


@pytest.fixture(scope="module")
def run(live_url: str, key: Key) -> Invoke:
    """`resnet-service ARGS` against the module's service with its key."""
    plaintext = key.headers["Authorization"].removeprefix("Bearer ")

    def invoke(*args: str, input: str | None = None) -> Result:
        return runner.invoke(app, [*args, "--url", live_url, "--key", plaintext], input=input)

    return invoke


def owned(settings: Settings, key: Key, job_id: uuid.UUID) -> str:
    """The job, made the key's own (as its submit would have made it); its id."""
    with session_scope(settings.database_url) as session:
        session.execute(update(Job).where(Job.id == job_id).values(owner_key_id=key.id))
    return str(job_id)


@pytest.fixture(scope="module")
def trained(settings: Settings, key: Key) -> str:
    """A succeeded train job of the key's, with real checkpoints (steps 1 and 2, best 2)."""
    return owned(settings, key, trained_job(settings))


def test_cancel_stops_queued_and_running_jobs_and_names_the_unknown(
    run: Invoke, settings: Settings, key: Key
) -> None:
    url = settings.database_url
    queued, running = owned(settings, key, new_job(url)), owned(settings, key, new_job(url))
    claim(url, uuid.UUID(running))
    unknown = str(uuid.uuid4())
    result = run("cancel", queued, running, unknown)
    assert result.exit_code == 1, result.output
    assert f"{queued} cancelled" in result.stdout
    assert f"{running} cancel requested: it is running" in result.stdout
    assert f"{unknown} refused: job {unknown} does not exist" in result.stderr
    assert job(url, uuid.UUID(queued)).status == "cancelled"
    assert job(url, uuid.UUID(running)).cancel_requested
    again = run("cancel", queued, "--json")
    assert again.exit_code == 1
    assert json.loads(again.stdout)[0]["status_code"] == 409
    assert f"job {queued} is already cancelled" in again.stderr


def test_retry_queues_a_cancelled_job_and_refuses_a_queued_one(
    run: Invoke, settings: Settings, key: Key
) -> None:
    url = settings.database_url
    job_id = owned(settings, key, new_job(url))
    assert run("cancel", job_id).exit_code == 0
    result = run("retry", job_id)
    assert result.exit_code == 0, result.output
    assert f"{job_id} queued: retried: no verified checkpoint, so it starts over" in result.stdout
    assert job(url, uuid.UUID(job_id)).status == "queued"
    refused = run("retry", job_id)
    assert refused.exit_code == 1
    assert "only a failed, cancelled or pruned job can be retried" in refused.stderr
    assert run("retry", str(uuid.uuid4())).exit_code == 1
    invalid = run("retry", "not-a-job")
    assert invalid.exit_code == 2
    assert "job_id: Input should be a valid UUID" in invalid.stderr


def test_delete_asks_first_and_refuses_a_running_job(
    run: Invoke, settings: Settings, key: Key
) -> None:
    url = settings.database_url
    ended, running = owned(settings, key, new_job(url)), owned(settings, key, new_job(url))
    claim(url, uuid.UUID(running))
    kept = run("delete", ended, input="n\n")
    assert kept.exit_code == 1
    assert "Aborted" in kept.output
    assert job(url, uuid.UUID(ended)).status == "queued"  # asked, and nothing went
    result = run("delete", ended, running, input="y\n")
    assert result.exit_code == 1
    assert f"{ended} deleted" in result.stdout
    assert f"{running} refused: job {running} is running; cancel it first" in result.stderr
    with session_scope(url) as session:
        assert session.get(Job, uuid.UUID(ended)) is None
        assert session.get(Job, uuid.UUID(running)) is not None
    answer = run("delete", ended, "--yes", "--json")
    assert answer.exit_code == 1
    assert json.loads(answer.stdout) == [
        {"id": ended, "error": f"job {ended} does not exist", "status_code": 404}
    ]


def test_register_prints_the_version_and_refuses_an_unfinished_job(
    run: Invoke, trained: str, settings: Settings, key: Key
) -> None:
    first = run("register", trained, "cmd-net")
    assert first.exit_code == 0, first.output
    assert first.stdout.startswith(f"cmd-net/1: job {trained} best checkpoint (step 2")
    last = run("register", trained, "cmd-net", "--checkpoint", "last", "--json")
    assert last.exit_code == 0, last.output
    assert (json.loads(last.stdout)["version"], json.loads(last.stdout)["step"]) == (2, 2)
    queued = owned(settings, key, new_job(settings.database_url))
    refused = run("register", queued, "cmd-net")
    assert refused.exit_code == 1
    assert queued in refused.stderr
    bad = run("register", trained, "cmd-net", "--checkpoint", "worst")
    assert bad.exit_code == 2


def test_download_checks_what_it_saves_and_overwrites_only_with_force(
    run: Invoke, trained: str, live_url: str, key: Key, tmp_path: Path
) -> None:
    with Client(live_url, key.headers["Authorization"].removeprefix("Bearer ")) as client:
        recorded = {row["step"]: row["sha256"] for row in client.checkpoints(trained)}
        client.register("dl-net", trained)
    result = run("download", trained, "-o", str(tmp_path))
    assert result.exit_code == 0, result.output
    saved = tmp_path / f"job-{trained}-step-2.pt"
    assert f"saved {saved} ({saved.stat().st_size:,} bytes, sha256 checked)" in result.stdout
    assert hashlib.sha256(saved.read_bytes()).hexdigest() == recorded[2]

    saved.write_bytes(b"mine")
    refused = run("download", trained, "-o", str(tmp_path))
    assert refused.exit_code == 1
    assert f"{saved} exists" in refused.stderr
    assert saved.read_bytes() == b"mine"  # left as it was
    forced = run("download", trained, "-o", str(tmp_path), "--force")
    assert forced.exit_code == 0, forced.output
    assert hashlib.sha256(saved.read_bytes()).hexdigest() == recorded[2]

    step = run("download", trained, "--checkpoint", "1", "-o", str(tmp_path / "one.pt"))
    assert step.exit_code == 0, step.output
    assert hashlib.sha256((tmp_path / "one.pt").read_bytes()).hexdigest() == recorded[1]
    version = run("download", "dl-net/1", "-o", str(tmp_path / "v.pt"))
    assert version.exit_code == 0, version.output
    assert hashlib.sha256((tmp_path / "v.pt").read_bytes()).hexdigest() == recorded[2]

    missing = run("download", trained, "--checkpoint", "7", "-o", str(tmp_path))
    assert missing.exit_code == 1
    assert f"job {trained} has no step 7 checkpoint" in missing.stderr
    unexported = run("download", "dl-net/1", "--export", "onnx", "-o", str(tmp_path))
    assert unexported.exit_code == 1
    assert "onnx" in unexported.stderr
    assert run("download", "nobody@prod", "-o", str(tmp_path)).exit_code == 1


def test_workers_lists_the_register(run: Invoke, settings: Settings) -> None:
    name = f"cmd-{uuid.uuid4().hex[:6]}@host"
    with session_scope(settings.database_url) as session:
        workers.register(
            session=session, name=name, host="host", pid=7, devices=["cpu"], queues=["cpu"]
        )
    result = run("workers")
    assert result.exit_code == 0, result.output
    row = next(line for line in result.stdout.splitlines() if name in line)
    assert "alive" in row
    listed = run("workers", "--json")
    assert listed.exit_code == 0, listed.output
    (mine,) = [worker for worker in json.loads(listed.stdout) if worker["name"] == name]
    assert (mine["devices"], mine["queues"], mine["current_job"]) == (["cpu"], ["cpu"], None)


def test_a_service_that_is_not_there_is_named() -> None:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    result = runner.invoke(app, ["workers", "--url", f"http://127.0.0.1:{port}"])
    assert result.exit_code == 1
    assert f"the service at http://127.0.0.1:{port} is unreachable" in result.stderr

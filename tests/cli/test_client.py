"""The command-line client against a real HTTP server: submit, jobs, watch, keys create."""

from __future__ import annotations

import threading
import uuid

import httpx
import pytest
import redis
from typer.testing import CliRunner

from cli.main import app
from core import jobs
from core.db.session import session_scope
from core.queue import QUEUE
from core.settings import Settings, get_settings
from tests.helpers import claim, finish, make_key, new_job

runner = CliRunner()


@pytest.fixture(scope="module")
def key(settings: Settings) -> str:
    return make_key(settings.database_url, "read", "train")


def test_submit_prints_the_id_of_a_queued_job(
    live_url: str, key: str, queue: redis.Redis, settings: Settings
) -> None:
    args = ["submit", "--model", "resnet20", "--dataset", "digits", "--epochs", "3"]
    args += ["-r", "lr=0.05", "-o", "shortcut=B", "--tag", "cli", "--url", live_url, "--key", key]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    job_id = result.stdout.strip()
    headers = {"Authorization": f"Bearer {key}"}
    job = httpx.get(f"{live_url}/api/v1/jobs/{job_id}", headers=headers).json()
    assert job["spec"]["recipe"]["lr"] == 0.05
    assert job["spec"]["recipe"]["epochs"] == 3
    assert job["spec"]["model"]["options"] == {"shortcut": "B"}
    assert queue.llen(QUEUE) == 1


def test_submit_asks_for_gpus_and_the_job_goes_to_their_queue(
    live_url: str, key: str, queue: redis.Redis
) -> None:
    args = ["submit", "--model", "resnet8", "--epochs", "1", "--gpus", "2", "--url", live_url]
    result = runner.invoke(app, [*args, "--key", key])
    assert result.exit_code == 0, result.output
    headers = {"Authorization": f"Bearer {key}"}
    job = httpx.get(f"{live_url}/api/v1/jobs/{result.stdout.strip()}", headers=headers).json()
    assert job["spec"]["resources"] == {"device": "gpu", "gpus": 2}
    assert (queue.llen("gpu-2"), queue.llen(QUEUE)) == (1, 0)


def test_submit_reports_each_invalid_field(live_url: str, key: str, queue: redis.Redis) -> None:
    args = ["submit", "--model", "resnet21", "-r", "lr=-1", "--url", live_url, "--key", key]
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert "model: model 'resnet21'" in result.stderr
    assert "recipe.lr: Input should be greater than 0" in result.stderr
    assert queue.llen(QUEUE) == 0


def test_jobs_lists_a_table(live_url: str, key: str, settings: Settings) -> None:
    job_id = new_job(settings.database_url, name="listed by the cli")
    args = ["jobs", "--status", "queued", "--limit", "200", "--url", live_url, "--key", key]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    row = next(line for line in result.stdout.splitlines() if str(job_id)[:8] in line)
    assert "listed by the cli" in row
    assert "queued" in row
    unauthorized = runner.invoke(app, ["jobs", "--url", live_url, "--key", "rs_0_0"])
    assert unauthorized.exit_code == 1
    assert "unknown or revoked" in unauthorized.stderr


def test_jobs_filters_exports_csv_and_edit_changes_a_note(
    live_url: str, key: str, settings: Settings
) -> None:
    tag = f"cli-{uuid.uuid4().hex[:8]}"
    made = [str(new_job(settings.database_url, tags=[tag], recipe={"lr": lr})) for lr in (0.1, 0.3)]
    server = ["--url", live_url, "--key", key]
    args = ["jobs", "--tag", tag, "--filter", "recipe.lr>0.2", "--csv", "--column", "recipe.lr"]
    result = runner.invoke(app, [*args, *server])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].endswith(",recipe.lr")
    assert [line.split(",")[0] for line in lines[1:]] == made[1:]
    bad = runner.invoke(app, ["jobs", "--filter", "recipe.lr<<1", *server])
    assert bad.exit_code == 2
    assert "starts with an operator" in bad.stderr
    with httpx.Client(base_url=live_url, headers={"Authorization": f"Bearer {key}"}) as http:
        spec = {"kind": "train", "model": {"name": "resnet8"}, "dataset": {"name": "digits"}}
        mine = http.post("/api/v1/jobs", json=spec).json()["id"]
    edited = runner.invoke(app, ["edit", mine, "--tag", "keep", "--note", "lr too high", *server])
    assert edited.exit_code == 0, edited.output
    assert "keep" in edited.stdout
    assert "lr too high" in edited.stdout


def _work(url: str, job_id: uuid.UUID) -> None:
    token = claim(url, job_id)
    with session_scope(url) as session:
        jobs.heartbeat(
            session=session, job_id=job_id, token=token, lease_seconds=60, step=8, total_steps=8
        )
        jobs.add_event(
            session=session, job_id=job_id, level="info", message="epoch 1 done", token=token
        )
    finish(url, job_id, token, best_test_error=0.1)


def test_watch_follows_a_job_until_it_succeeds(live_url: str, key: str, settings: Settings) -> None:
    job_id = new_job(settings.database_url)
    worker = threading.Thread(target=_work, args=(settings.database_url, job_id))
    worker.start()
    result = runner.invoke(app, ["watch", str(job_id), "--url", live_url, "--key", key])
    worker.join(10)
    assert result.exit_code == 0, result.output
    assert "epoch 1 done" in result.stdout
    assert f"job {job_id} succeeded" in result.stdout
    missing = runner.invoke(app, ["watch", str(uuid.uuid4()), "--url", live_url, "--key", key])
    assert missing.exit_code == 1
    assert "does not exist" in missing.stderr


def test_keys_create_prints_a_working_key_once(
    live_url: str, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DATABASE_URL", settings.database_url)
    get_settings.cache_clear()
    try:
        result = runner.invoke(app, ["keys", "create", "--name", "ci", "--scope", "read"])
    finally:
        get_settings.cache_clear()
    assert result.exit_code == 0, result.output
    plaintext = result.stdout.strip()
    assert plaintext.startswith("rs_")
    headers = {"Authorization": f"Bearer {plaintext}"}
    assert httpx.get(f"{live_url}/api/v1/jobs", headers=headers).status_code == 200
    assert httpx.post(f"{live_url}/api/v1/jobs", json={}, headers=headers).status_code == 403


def test_jobs_finds_the_jobs_of_a_data_digest_and_shows_its_start(
    live_url: str, key: str, settings: Settings
) -> None:
    url, digest = settings.database_url, f"sha256:{uuid.uuid4().hex}{uuid.uuid4().hex}"
    job_id, other = new_job(url, name="read the data"), new_job(url, name="read nothing")
    token = claim(url, job_id)
    with session_scope(url) as session:
        data = {"digest": digest, "classes": [], "splits": {}, "skipped": []}
        jobs.record_run(session=session, job_id=job_id, token=token, data=data, environment={})
    args = ["jobs", "--data-digest", digest.removeprefix("sha256:")[:10], "--url", live_url]
    result = runner.invoke(app, [*args, "--key", key])
    assert result.exit_code == 0, result.output
    assert str(job_id)[:8] in result.stdout
    assert str(other)[:8] not in result.stdout
    assert digest.removeprefix("sha256:")[:12] in result.stdout

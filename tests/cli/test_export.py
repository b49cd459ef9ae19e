"""`resnet-service export` and the client's downloads against a real HTTP server."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from api.app import create_app
from cli.main import app
from client import Client
from core.settings import Settings
from tests.helpers import make_key, trained_job
from tests.services import serve

runner = CliRunner()


@pytest.fixture(scope="module")
def live_url(settings: Settings) -> Iterator[str]:
    with serve(create_app(settings)) as url:
        yield url


@pytest.fixture(scope="module")
def key(settings: Settings) -> str:
    return make_key(settings.database_url, "read", "train")


@pytest.fixture(scope="module")
def job_id(live_url: str, key: str, settings: Settings) -> uuid.UUID:
    """A trained job, registered as `cli-net` version 1 with the alias `prod`."""
    job = trained_job(settings)
    with Client(live_url, key) as client:
        client.register("cli-net", job)
        client.set_alias("cli-net", "prod", 1)
    return job


def test_export_makes_checks_and_downloads_a_version(
    live_url: str, key: str, job_id: uuid.UUID, tmp_path: Path
) -> None:
    args = ["export", "cli-net@prod", "--format", "torchscript", "--out", str(tmp_path)]
    result = runner.invoke(app, [*args, "--url", live_url, "--key", key])
    assert result.exit_code == 0, result.output
    assert "cli-net/1 torchscript:" in result.stdout
    assert "(bound 0.0001)" in result.stdout
    saved = tmp_path / "cli-net-v1.torchscript.pt"
    assert f"saved {saved}" in result.stdout
    with Client(live_url, key) as client:
        (made,) = client.exports("cli-net/1")
    assert hashlib.sha256(saved.read_bytes()).hexdigest() == made["sha256"]

    unknown = runner.invoke(app, ["export", "nobody", "--url", live_url, "--key", key])
    assert unknown.exit_code == 1
    assert "model 'nobody' is not registered" in unknown.stderr


def test_the_client_downloads_checkpoints_of_jobs_and_versions(
    live_url: str, key: str, job_id: uuid.UUID, tmp_path: Path
) -> None:
    with Client(live_url, key) as client:
        recorded = {row["step"]: row["sha256"] for row in client.checkpoints(job_id)}
        first = client.download_checkpoint(job_id, which=1, to=tmp_path)
        version = client.download_checkpoint("cli-net", to=tmp_path / "v.pt")
    assert first.name == f"job-{job_id}-step-1.pt"
    assert hashlib.sha256(first.read_bytes()).hexdigest() == recorded[1]
    assert hashlib.sha256(version.read_bytes()).hexdigest() == recorded[2]

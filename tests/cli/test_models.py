"""`resnet-service alias|promote|history` against a real HTTP server."""

from __future__ import annotations

import uuid

import httpx
import pytest
from typer.testing import CliRunner

from cli.main import app
from core.settings import Settings
from tests.helpers import make_key, recorded_job

runner = CliRunner()


@pytest.fixture(scope="module")
def key(settings: Settings) -> str:
    return make_key(settings.database_url, "read", "train")


@pytest.fixture(scope="module")
def model(live_url: str, key: str, settings: Settings) -> str:
    """A model of three versions (their checkpoints are only rows: nothing is served)."""
    name = f"cli-{uuid.uuid4().hex[:6]}"
    headers = {"Authorization": f"Bearer {key}"}
    for _ in range(3):
        job = {"job": str(recorded_job(settings.database_url))}
        added = httpx.post(f"{live_url}/api/v1/registry/{name}/versions", json=job, headers=headers)
        assert added.status_code == 201, added.text
    return name


def _run(live_url: str, key: str, *args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, [*args, "--url", live_url, "--key", key])
    return result.exit_code, result.stdout, result.stderr


def test_alias_weights_sticky_shadow_then_promote_and_history(
    live_url: str, key: str, model: str
) -> None:
    code, out, err = _run(
        live_url, key, "alias", model, "production", "1=90", "2=10", "--sticky", "--shadow", "3:20"
    )
    assert code == 0, err
    assert out.strip() == f"{model}@production: 1=90 2=10, sticky, shadow {model}/3 (20%)"
    code, out, err = _run(live_url, key, "promote", model, "production", "2")
    assert code == 0, err
    assert out.strip() == f"{model}@production -> {model}/2"
    code, out, err = _run(live_url, key, "alias", model, "staging", "3")
    assert (code, out.strip()) == (0, f"{model}@staging -> {model}/3"), err
    code, out, err = _run(live_url, key, "alias", model, "staging", "--delete")
    assert (code, out.strip()) == (0, f"{model}@staging removed"), err
    code, out, err = _run(live_url, key, "history", model)
    assert code == 0, err
    lines = out.strip().splitlines()
    assert [line.split("  ")[2] for line in lines[:4]] == [
        "alias.deleted staging v3",
        "alias.created staging v3",
        "alias.promoted production v2",
        "alias.created production v1",
    ]
    assert "1=90 2=10 shadow 3:20 sticky -> 2=100" in lines[2]
    assert all(line.split("  ")[1] == "test" for line in lines)  # the key's name


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["1=90", "9=10"], "has no version 9"),
        (["1=0", "2=10"], "the weight of version 1 is 0"),
        (["1", "--shadow", "x"], "VERSION:PERCENT"),
        (["1:90"], "VERSION=WEIGHT"),
        ([], "--delete"),
    ],
)
def test_a_wrong_alias_says_what_to_change(
    live_url: str, key: str, model: str, args: list[str], message: str
) -> None:
    code, _, err = _run(live_url, key, "alias", model, "canary", *args)
    assert code != 0
    assert message in " ".join(err.split())

"""`resnet-service import` against a real HTTP server: a file becomes a version."""

from __future__ import annotations

from pathlib import Path

import torch
from typer.testing import CliRunner

import models
from cli.main import app
from core.settings import Settings
from tests.helpers import make_key
from tests.training.test_weights import akamaster_file

runner = CliRunner()


def test_import_registers_a_file_and_names_what_it_read(
    live_url: str, settings: Settings, tmp_path: Path
) -> None:
    key = make_key(settings.database_url, "read", "train")
    torch.manual_seed(0)
    path = akamaster_file(tmp_path / "resnet20.th", models.build("resnet20", num_classes=4))
    (tmp_path / "classes.txt").write_text("north\neast\nsouth\nwest\n")
    args = ["import", str(path), "--name", "cli-imported", "--architecture", "resnet20"]
    args += ["--classes", str(tmp_path / "classes.txt"), "--url", live_url, "--key", key]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "cli-imported/1: resnet20 from resnet20.th (akamaster, " in result.stdout
    wrong = runner.invoke(app, [*args[:5], "resnet32", *args[6:]])
    assert wrong.exit_code == 2
    assert "missing" in wrong.output
    neither = runner.invoke(app, ["import", "--name", "x", "--url", live_url, "--key", key])
    assert neither.exit_code == 2

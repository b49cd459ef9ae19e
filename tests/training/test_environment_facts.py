"""environment(): each fact as the libraries and the checkout say it, plain, and read once."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import torch
import torchvision

from training import environment as env_module
from training.environment import environment

ROOT = Path(env_module.__file__).resolve().parent.parent


def test_each_fact_is_what_its_source_says() -> None:
    facts = environment()
    assert facts["torch"] == str(torch.__version__)
    assert type(facts["torch"]) is str  # not a TorchVersion: weights-only loads take it
    assert facts["torchvision"] == torchvision.__version__
    assert facts["cuda"] == torch.version.cuda
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    assert facts["cudnn"] == cudnn
    assert facts["device_type"] == "cpu"
    assert facts["device"]
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    if head.returncode == 0:
        assert facts["git_commit"].removesuffix("+dirty") == head.stdout.strip()
    assert json.loads(json.dumps(facts)) == facts


def test_a_caller_editing_its_copy_changes_nothing_for_the_next() -> None:
    first = environment(torch.device("cpu"))
    first["torch"] = "edited"
    assert environment(torch.device("cpu"))["torch"] == str(torch.__version__)

"""The command line imports without a cycle and without the API (each in a fresh interpreter)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# What the whole command line imports: the API's modules it pulled in, and its commands.
WHOLE = (
    "import json, sys, cli.main, core, core.keys, worker.runner, training, models; "
    "print(json.dumps({'api': sorted(m for m in sys.modules if m == 'api' or m.startswith('api.')),"
    " 'commands': len(cli.main.app.registered_commands)}))"
)


def _run(code: str) -> str:
    """What `code` prints in a fresh interpreter."""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.fixture(scope="module")
def whole() -> dict[str, object]:
    """The command line imported whole, once for the module."""
    answer: dict[str, object] = json.loads(_run(WHOLE))
    return answer


def test_the_product_packages_do_not_import_the_api(whole: dict[str, object]) -> None:
    # Modules may import the API inside a function (`api` serves it); none at import time.
    assert whole["api"] == []
    assert isinstance(whole["commands"], int)
    assert whole["commands"] > 20


@pytest.mark.parametrize("module", ["cli.client", "cli.keys", "cli.local", "cli.server"])
def test_a_command_module_imports_on_its_own(module: str, whole: dict[str, object]) -> None:
    # Imported before cli.main, a command module that needed the app back would fail.
    code = f"import {module}, cli.main; print(len(cli.main.app.registered_commands))"
    assert int(_run(code)) == whole["commands"]

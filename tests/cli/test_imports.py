"""The command line imports without a cycle and without the API (each in a fresh interpreter)."""

from __future__ import annotations

import subprocess
import sys

import pytest


def _run(code: str) -> str:
    """What `code` prints in a fresh interpreter."""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_product_packages_do_not_import_the_api() -> None:
    # Modules may import the API inside a function (`api` serves it); none at import time.
    code = (
        "import sys, cli.main, core, core.keys, worker.runner, training, models; "
        "print(sorted(m for m in sys.modules if m == 'api' or m.startswith('api.')))"
    )
    assert _run(code) == "[]"


@pytest.mark.parametrize("module", ["cli.client", "cli.keys", "cli.local", "cli.server"])
def test_a_command_module_imports_on_its_own(module: str) -> None:
    # Imported before cli.main, a command module that needed the app back would fail.
    code = f"import {module}, cli.main; print(len(cli.main.app.registered_commands))"
    assert _run(code) == _run("import cli.main; print(len(cli.main.app.registered_commands))")

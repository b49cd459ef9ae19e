"""The client is light: importing it and making one loads no torch, database or API code."""

from __future__ import annotations

import subprocess
import sys


def test_the_client_loads_no_service_code() -> None:
    code = (
        "import sys, client; client.Client(); "
        "print(sorted({m.split('.')[0] for m in sys.modules} & "
        "{'torch', 'api', 'sqlalchemy', 'celery', 'training', 'models', 'worker', 'pandas'}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"

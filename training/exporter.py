"""One checkpoint's export, checked (`training.export.export_checked`), in a process of its
own: the API's process never traces a net (torch.export patches module calls process-wide,
which the zoo's counts would wait for) nor holds its memory (ResNet-1202: +535 MB).

`export_in_process` runs `python -m training.exporter` and reads back what it wrote: the
file at `path`, and `<path>.json`, the check's figures or the refusal.

    python -m training.exporter CHECKPOINT SHA256 FORMAT PATH TOLERANCE
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from training import export
from training.checkpoints import CheckpointError

STDERR_TAIL = 2000  # characters of a failed export's stderr its error keeps


class ExportFailedError(RuntimeError):
    """The export's process failed (killed, out of memory, a bug) or ran out of time."""


def export_in_process(
    checkpoint: Path,
    sha256: str,
    fmt: export.Format,
    path: Path,
    *,
    timeout_s: float,
    tolerance: float = export.TOLERANCE,
) -> export.Checked:
    """`export.export_checked` of the checkpoint's net, in a child process ended after
    `timeout_s`; its `ExportMismatchError` and `CheckpointError` are raised here."""
    command = [sys.executable, "-m", __name__, str(checkpoint), sha256, fmt, str(path)]
    command.append(repr(tolerance))
    try:
        done = subprocess.run(command, capture_output=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:  # run() killed it
        path.unlink(missing_ok=True)
        raise ExportFailedError(
            f"the {fmt} export ran over its {timeout_s:g} s (EXPORT_TIMEOUT_S) and was "
            "stopped; nothing was kept"
        ) from None
    outcome = _outcome(path)
    if done.returncode != 0 or outcome is None:
        tail = done.stderr.decode(errors="replace")[-STDERR_TAIL:].strip()
        raise ExportFailedError(
            f"the {fmt} export's process failed (exit status {done.returncode}): {tail}"
        )
    if "mismatch" in outcome:
        raise export.ExportMismatchError(fmt, outcome["mismatch"], tolerance)
    if "checkpoint" in outcome:
        raise CheckpointError(outcome["checkpoint"])
    return export.Checked(outcome["max_abs_diff"], outcome["tolerance"], outcome["details"])


def _result(path: Path) -> Path:
    return path.with_name(f"{path.name}.json")


def _outcome(path: Path) -> dict[str, Any] | None:
    result = _result(path)
    if not result.is_file():
        return None
    outcome: dict[str, Any] = json.loads(result.read_text())
    return outcome


def main(argv: list[str]) -> None:
    """Export, check and write the outcome beside the export (see the module's docstring)."""
    from training.runs import load_trained_model  # here: the parent needs none of it

    checkpoint, sha256, fmt, out, tolerance = argv
    path = Path(out)
    outcome: dict[str, Any]
    try:
        trained = load_trained_model(Path(checkpoint), sha256=sha256)
        checked = export.export_checked(
            trained.model,
            trained.info,
            fmt,  # type: ignore[arg-type]  # the parent passes one of export.FORMATS
            path,
            trained.preprocessing,
            tolerance=float(tolerance),
        )
        outcome = {
            "max_abs_diff": checked.max_abs_diff,
            "tolerance": checked.tolerance,
            "details": checked.details,
        }
    except export.ExportMismatchError as error:
        outcome = {"mismatch": error.max_abs_diff}
    except CheckpointError as error:
        outcome = {"checkpoint": str(error)}
    _result(path).write_text(json.dumps(outcome))


if __name__ == "__main__":
    main(sys.argv[1:])

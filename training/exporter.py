"""One checkpoint's export, checked (`training.export.export_checked`), in a process of its
own: the API's process never traces a net (torch.export patches module calls process-wide,
which the zoo's counts would wait for) nor holds its memory (ResNet-1202: +535 MB).

`export_in_process` runs `python -m training.exporter` and reads back what it wrote: the
file at `path`, and `<path>.json`, the check's figures or the refusal. An int8 graph
(`training.quantize`) takes its calibration and bound as JSON, with where the run's data
lies:

    python -m training.exporter CHECKPOINT SHA256 FORMAT PATH TOLERANCE [INT8_JSON]
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from training import export, quantize
from training.checkpoints import CheckpointError

if TYPE_CHECKING:
    from training.runs import Trained

STDERR_TAIL = 2000  # characters of a failed export's stderr its error keeps


class ExportFailedError(RuntimeError):
    """The export's process failed (killed, out of memory, a bug) or ran out of time."""


@dataclass(frozen=True)
class Int8Request:
    """An int8 graph's calibration and bound, and where the run's dataset is read."""

    options: quantize.Int8Options
    data_root: Path
    download: bool = False

    def to_json(self) -> str:
        fields = dataclasses.asdict(self.options)
        return json.dumps({**fields, "data_root": str(self.data_root), "download": self.download})

    @classmethod
    def from_json(cls, text: str) -> Int8Request:
        fields = json.loads(text)
        root, download = Path(fields.pop("data_root")), fields.pop("download")
        return cls(quantize.Int8Options(**fields), root, download)


def export_in_process(
    checkpoint: Path,
    sha256: str,
    fmt: export.Format,
    path: Path,
    *,
    timeout_s: float,
    tolerance: float = export.TOLERANCE,
    int8: Int8Request | None = None,
) -> export.Checked:
    """`export.export_checked` of the checkpoint's net (for onnx_int8,
    `quantize.quantize_checked` as `int8` asks), in a child process ended after `timeout_s`;
    its `ExportMismatchError`, `Int8OverBoundError`, `QuantizationDataError` and
    `CheckpointError` are raised here."""
    command = [sys.executable, "-m", __name__, str(checkpoint), sha256, fmt, str(path)]
    command.append(repr(tolerance))
    if fmt == "onnx_int8":
        command.append((int8 or Int8Request(quantize.Int8Options(), Path("."))).to_json())
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
    if "over_bound" in outcome:
        raise quantize.Int8OverBoundError(**outcome["over_bound"])
    if "data" in outcome:
        raise quantize.QuantizationDataError(outcome["data"])
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

    checkpoint, sha256, fmt, out, tolerance, *int8 = argv
    path = Path(out)
    outcome: dict[str, Any]
    try:
        trained = load_trained_model(Path(checkpoint), sha256=sha256)
        if fmt == "onnx_int8":
            checked = _int8(trained, path, Int8Request.from_json(int8[0]))
        else:
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
    except quantize.Int8OverBoundError as error:
        fields = ("float_error", "int8_error", "bound_pp", "images")
        outcome = {"over_bound": {field: getattr(error, field) for field in fields}}
    except quantize.QuantizationDataError as error:
        outcome = {"data": str(error)}
    except CheckpointError as error:
        outcome = {"checkpoint": str(error)}
    _result(path).write_text(json.dumps(outcome))


def _int8(trained: Trained, path: Path, request: Int8Request) -> export.Checked:
    """The checkpoint's int8 graph, calibrated and judged on its run's dataset."""
    data, eval_split = quantize.run_dataset(
        trained.spec, data_root=request.data_root, download=request.download
    )
    if data.info.classes != trained.info.classes:
        raise quantize.QuantizationDataError(
            f"the run's dataset now has the classes {list(data.info.classes)}, not the "
            f"net's {list(trained.info.classes)}"
        )
    return quantize.quantize_checked(
        trained.model, trained.info, trained.preprocessing, data, eval_split, path, request.options
    )


if __name__ == "__main__":
    main(sys.argv[1:])

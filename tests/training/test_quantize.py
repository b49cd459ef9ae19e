"""The int8 graph of a trained net: calibrated on training images, judged on the evaluation
split against the float graph, refused (and removed) over its bound; a reduced precision of
the torch predictor within its bound of fp32, refused beyond it."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from training import checkpoints, quantize
from training.data import LoadedDataset
from training.datasets import load_dataset
from training.events import RecordingSink
from training.loop import fit
from training.options import RunOptions
from training.predictor import PrecisionMismatchError, Predictor
from training.runs import Trained, load_trained_model
from training.specs import TrainSpec

SPEC = {
    "model": {"name": "resnet8"},
    "dataset": {"name": "digits", "validation": 0},
    "recipe": {"epochs": 1, "batch_size": 64, "augment": False},
}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Trained, LoadedDataset]:
    root = tmp_path_factory.mktemp("digits")
    spec = TrainSpec.model_validate(SPEC)
    data = load_dataset(spec.dataset, data_root=root)
    fit(spec, data, RunOptions(out_dir=root), RecordingSink())
    path = root / "checkpoints" / "best.pt"
    return path, load_trained_model(path), data


def test_an_int8_graph_within_the_bound_is_kept_with_its_figures(
    run: tuple[Path, Trained, LoadedDataset], tmp_path: Path
) -> None:
    _, trained, data = run
    out = tmp_path / "model.int8.onnx"
    options = quantize.Int8Options(calibration_images=32, bound_pp=100, eval_limit=100)
    checked = quantize.quantize_checked(
        trained.model, trained.info, trained.preprocessing, data, "test", out, options
    )
    details = checked.details
    assert (details["calibration_images"], details["eval_images"]) == (32, 100)
    assert 0 <= details["float_error"] < 0.5  # trained: well under chance (0.9)
    assert checked.max_abs_diff == max(0.0, details["error_increase_pp"]) <= 100
    assert min(details["int8_images_per_s"], details["float_images_per_s"]) > 0
    nodes = onnx.load(str(out)).graph.node
    assert any(node.op_type == "QuantizeLinear" for node in nodes)
    assert [node.op_type for node in nodes][-1] == "Softmax"  # probabilities stay float


def test_over_the_bound_nothing_is_kept_and_both_errors_are_said(
    run: tuple[Path, Trained, LoadedDataset], tmp_path: Path
) -> None:
    _, trained, data = run
    out = tmp_path / "model.int8.onnx"
    # A bound no graph can meet: 100 points better than the float graph.
    options = quantize.Int8Options(calibration_images=16, bound_pp=-100, eval_limit=50)
    with pytest.raises(quantize.Int8OverBoundError, match=r"error on 50 evaluation images") as e:
        quantize.quantize_checked(
            trained.model, trained.info, trained.preprocessing, data, "test", out, options
        )
    assert f"{100 * e.value.float_error:.2f}%" in str(e.value)
    assert f"{100 * e.value.int8_error:.2f}%" in str(e.value)
    assert not out.exists()


def test_imported_weights_have_no_dataset_to_calibrate_on() -> None:
    with pytest.raises(quantize.QuantizationDataError, match="names no dataset"):
        quantize.run_dataset({"model": {"name": "resnet8"}}, data_root=Path("."), download=False)


def test_bf16_and_fp16_serve_within_the_bound_of_fp32(
    run: tuple[Path, Trained, LoadedDataset],
) -> None:
    path, _, _ = run
    sha256 = checkpoints.sha256_of(path)
    fp32 = Predictor(path, sha256=sha256, fold=True)
    for precision in ("bf16", "fp16"):
        reduced = Predictor(path, sha256=sha256, fold=True, precision=precision)
        assert 0 < reduced.precision_diff <= 0.05
        probe = fp32.probe()
        difference = (reduced.probabilities(probe) - fp32.probabilities(probe)).abs().max()
        assert float(difference) == pytest.approx(reduced.precision_diff)
    with pytest.raises(PrecisionMismatchError, match="over the bound of 1e-06"):
        Predictor(path, sha256=sha256, fold=True, precision="bf16", tolerance=1e-6)

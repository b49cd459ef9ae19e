"""The model processes' backends: ONNX Runtime gives torch's probabilities within the bound."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from serving.process import SMALL_BATCH, backend_for, forward_for
from training import checkpoints, export
from training.datasets import load_dataset
from training.events import RecordingSink
from training.loop import fit
from training.options import RunOptions
from training.predictor import Predictor
from training.specs import TrainSpec


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A one-step ResNet-8 on 8x8 images, and its sha256."""
    root = tmp_path_factory.mktemp("run")
    spec = TrainSpec.model_validate(
        {
            "model": {"name": "resnet8"},
            "dataset": {"name": "synthetic", "image_size": 8, "train_size": 32, "test_size": 8},
            "recipe": {"iterations": 1, "batch_size": 16},
        }
    )
    fit(spec, load_dataset(spec.dataset, data_root=root), RunOptions(out_dir=root), RecordingSink())
    path = root / "checkpoints" / "best.pt"
    return path, checkpoints.sha256_of(path)


@pytest.fixture(scope="module")
def predictor(checkpoint: tuple[Path, str]) -> Predictor:
    """The checkpoint's net in its serving form, as the torch backend runs it."""
    path, sha256 = checkpoint
    return Predictor(path, sha256=sha256, fold=True)


@pytest.fixture(scope="module")
def exported(predictor: Predictor, monkeypatch_module: pytest.MonkeyPatch) -> None:
    """The net exported to ONNX once for the module (the export takes seconds)."""
    net = export.with_softmax(predictor.model)
    model = export.onnx_bytes(net, export.check_batch(predictor.info))
    monkeypatch_module.setattr(export, "onnx_bytes", lambda *_: model)


@pytest.fixture(scope="module")
def monkeypatch_module() -> Iterator[pytest.MonkeyPatch]:
    with pytest.MonkeyPatch.context() as patch:
        yield patch


@pytest.mark.usefixtures("exported")
def test_onnxruntime_gives_torchs_probabilities_at_small_and_large_batches(
    predictor: Predictor,
) -> None:
    forward = forward_for(predictor, "onnxruntime", threads=2)
    generator = torch.Generator().manual_seed(0)
    for size in (1, SMALL_BATCH, 3 * SMALL_BATCH):  # a one-thread session, then the other
        images = torch.randint(0, 256, (size, 3, 8, 8), dtype=torch.uint8, generator=generator)
        ours, torchs = forward(images), predictor.probabilities(images)
        assert ours.shape == torchs.shape
        assert (ours - torchs).abs().max().item() <= export.TOLERANCE


def test_auto_is_onnxruntime_on_the_cpu_and_torch_on_a_gpu() -> None:
    assert backend_for("auto", "cpu") == "onnxruntime"
    assert backend_for("auto", "cuda:0") == "torch"
    assert backend_for("torch", "cpu") == "torch"
    with pytest.raises(ValueError, match="runs on the CPU"):
        backend_for("onnxruntime", "cuda")


@pytest.mark.usefixtures("exported")
def test_an_export_that_disagrees_does_not_serve(
    predictor: Predictor, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(export, "max_abs_diff", lambda *_: 0.5)
    with pytest.raises(export.ExportMismatchError, match=r"by up to 0\.5,"):
        forward_for(predictor, "onnxruntime", threads=1)

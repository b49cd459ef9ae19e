"""Checked decoding, preprocessing and prediction equal to the evaluation engine."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from models.config import SHORTCUT_OPTIONS, SHORTCUT_VARIANTS, UNITS
from models.zoo import build
from tests import images
from training import checkpoints
from training.data import DatasetInfo, TensorSplit
from training.datasets import load_dataset
from training.events import RecordingSink
from training.loop import fit
from training.options import RunOptions
from training.predictor import (
    ImageRejectedError,
    ImageTooLargeError,
    Predictor,
    UndecodableImageError,
    UnsupportedImageError,
    fit_to,
    open_checked,
    serving_form,
)
from training.preprocess import Preprocessing
from training.specs import TrainSpec

INFO = DatasetInfo("t", ("a", "b"), 3, (8, 8), (0.5, 0.5, 0.5), (0.25, 0.25, 0.25))
PREPROCESSING = Preprocessing.of(INFO)


def test_a_valid_png_opens() -> None:
    image = open_checked(images.encode(Image.new("RGB", (5, 4), (10, 20, 30))), "ok.png")
    assert image.size == (5, 4)


@pytest.mark.parametrize(
    ("data", "error", "message"),
    [
        (b"", UndecodableImageError, "empty.png: the file is empty"),
        (b"hello, I am text", UnsupportedImageError, "not an image"),
        (
            images.encode(Image.new("RGB", (64, 64), (1, 2, 3)))[:60],
            UndecodableImageError,
            "truncated",
        ),
        (
            images.encode(Image.new("RGB", (4, 4)), "GIF"),
            UnsupportedImageError,
            "format GIF is not allowed",
        ),
    ],
)
def test_bad_files_are_refused_with_what_is_wrong(
    data: bytes, error: type[ImageRejectedError], message: str
) -> None:
    with pytest.raises(error) as excinfo:
        open_checked(data, "empty.png")
    assert message in str(excinfo.value)
    assert " at 0x" not in str(excinfo.value)  # no decoder object's address


def test_a_decompression_bomb_is_refused_without_decoding() -> None:
    started = time.perf_counter()
    with pytest.raises(ImageTooLargeError, match=r"bomb\.png: over the limit"):
        open_checked(images.png_header(20_000, 20_000), "bomb.png")
    # Below Pillow's own bomb threshold, our limit reads the size from the header.
    with pytest.raises(ImageTooLargeError, match="7000x7000 pixels is over the limit"):
        open_checked(images.png_header(7_000, 7_000), "big.png")
    assert time.perf_counter() - started < 0.5


def test_fit_to_resizes_crops_and_converts() -> None:
    same, how = fit_to(Image.new("RGB", (8, 8), (255, 0, 0)), PREPROCESSING)
    assert how == "none"
    assert same.shape == (3, 8, 8)
    assert same[0].min() == 255
    assert fit_to(Image.new("RGB", (32, 32)), PREPROCESSING)[1] == "resize"
    wide = Image.new("RGB", (40, 16), (0, 0, 0))
    wide.paste((255, 255, 255), (16, 0, 24, 16))  # a white band in the middle third
    cropped, how = fit_to(wide, PREPROCESSING)
    assert how == "resize+center-crop"
    assert cropped.shape == (3, 8, 8)
    assert cropped[:, :, 3:5].min() > 200  # the centre survived the crop
    gray = Preprocessing.of(DatasetInfo("g", ("a",), 1, (8, 8), (0.5,), (0.25,)))
    assert fit_to(Image.new("RGB", (8, 8), (255, 255, 255)), gray)[0].shape == (1, 8, 8)


@pytest.fixture(scope="module")
def digits_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, TensorSplit]:
    root = tmp_path_factory.mktemp("digits")
    spec = TrainSpec.model_validate(
        {
            "model": {"name": "resnet8"},
            "dataset": {"name": "digits", "validation": 0},
            "recipe": {"epochs": 2, "batch_size": 64, "augment": False},
        }
    )
    data = load_dataset(spec.dataset, data_root=root)
    fit(spec, data, RunOptions(out_dir=root), RecordingSink())
    assert isinstance(data.test, TensorSplit)
    return root / "checkpoints" / "best.pt", data.test


def test_prediction_on_png_files_equals_the_evaluation_engine(
    digits_checkpoint: tuple[Path, TensorSplit],
) -> None:
    path, test = digits_checkpoint
    predictor = Predictor(path, sha256=checkpoints.sha256_of(path))
    first = test.images[:32]
    decoded = []
    for image in first:
        png = images.encode(Image.fromarray(image[0].numpy(), mode="L"))
        array, how = fit_to(open_checked(png, "digit.png"), predictor.preprocessing)
        assert how == "none"
        decoded.append(torch.from_numpy(array))
    probabilities = predictor.probabilities(torch.stack(decoded))
    engine = images.engine_probabilities(
        predictor.model, predictor.info, TensorSplit(first, test.labels[:32])
    )
    assert torch.equal(probabilities, engine)
    top = predictor.classify(torch.stack(decoded), top_k=3)
    assert [len(t.labels) for t in top] == [3] * 32
    assert top[0].labels[0] == predictor.info.classes[int(engine[0].argmax())]
    assert np.isclose(sum(top[0].probabilities), float(engine[0].topk(3).values.sum()))


def test_a_checkpoint_with_the_wrong_sha_is_refused(
    digits_checkpoint: tuple[Path, TensorSplit],
) -> None:
    path, _ = digits_checkpoint
    with pytest.raises(checkpoints.CheckpointError, match="sha256 differs"):
        Predictor(path, sha256="0" * 64)


SERVED_NETS = [
    ("plain20", {}),
    ("preact_resnet110", {}),
    ("resnet18", {}),
    ("resnet50", {}),
    ("resnet20", {"block": "bottleneck"}),
    *(("resnet20", {"shortcut": option}) for option in SHORTCUT_OPTIONS),
    *(("resnet20", {"unit": unit}) for unit in UNITS),
    *(("resnet20", {"shortcut_variant": variant}) for variant in SHORTCUT_VARIANTS),
]


@pytest.mark.parametrize(("name", "options"), SERVED_NETS)
def test_the_serving_form_computes_what_the_eager_net_does(
    name: str, options: dict[str, Any]
) -> None:
    torch.manual_seed(0)
    net = build(name, **options).eval()
    with torch.no_grad():  # statistics as training leaves them, not the identity
        for name, buffer in net.named_buffers():
            if name.endswith("running_mean"):
                buffer.uniform_(-1, 1)
            elif name.endswith("running_var"):
                buffer.uniform_(0.5, 2)
        for module in net.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.weight.uniform_(0.5, 1.5)
                module.bias.uniform_(-0.5, 0.5)
    served = serving_form(net)
    x = torch.randn(4, 3, 32, 32)
    with torch.inference_mode():
        expected = net(x).softmax(1)
        got = served(x.contiguous(memory_format=torch.channels_last)).softmax(1)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    if net.arch.unit.unit != "full_preact":  # there every batch norm precedes its conv
        assert _batch_norms(served) < _batch_norms(net), "those after convolutions are folded"


def _batch_norms(net: torch.nn.Module) -> int:
    return sum(isinstance(module, torch.nn.BatchNorm2d) for module in net.modules())


def test_a_folding_predictor_classifies_as_the_evaluation_engine_does(
    digits_checkpoint: tuple[Path, TensorSplit],
) -> None:
    path, test = digits_checkpoint
    eager = Predictor(path, sha256=checkpoints.sha256_of(path))
    folding = Predictor(path, sha256=checkpoints.sha256_of(path), fold=True)
    batch = test.images[:64]
    expected = eager.probabilities(batch)
    torch.testing.assert_close(folding.probabilities(batch), expected, atol=1e-6, rtol=0)
    assert torch.equal(folding.probabilities(batch).argmax(1), expected.argmax(1))


def test_folding_and_counting_macs_in_two_threads_leave_each_other_alone() -> None:
    # torch.fx patches every module's call while it traces: the API counts the zoo's MACs
    # in one thread while it may fold a net to export it in another.
    from models.zoo import _measure, resolve

    arch = resolve("resnet20")
    expected = _measure.__wrapped__(arch, 10, 3, 32)
    net = build("resnet20").eval()
    counts: list[tuple[int, int, int]] = []
    errors: list[BaseException] = []

    def count() -> None:
        try:
            counts.extend(_measure.__wrapped__(arch, 10, 3, 32) for _ in range(6))
        except BaseException as error:
            errors.append(error)

    counter = threading.Thread(target=count)
    counter.start()
    folded = [serving_form(net) for _ in range(6)]
    counter.join()
    assert not errors, errors
    assert counts == [expected] * 6
    x = torch.randn(2, 3, 32, 32).contiguous(memory_format=torch.channels_last)
    with torch.inference_mode():
        assert all(torch.allclose(f(x), net(x), atol=1e-4) for f in folded)

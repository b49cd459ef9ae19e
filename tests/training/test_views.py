"""Evaluation views: the centre crop, ten crops and the fully convolutional multi-scale test."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from PIL import Image

from tests.training.test_preprocess import IMAGENET, photo
from training import checkpoints
from training.datasets import load_dataset
from training.evaluate import evaluate
from training.events import RecordingSink
from training.loop import fit
from training.options import RunOptions
from training.pipeline import make_batches
from training.preprocess import Preprocessing
from training.runs import evaluate_checkpoint, load_trained_model
from training.specs import TrainSpec
from training.views import PAPER_SCALES, evaluate_views, looks, mean_of_looks, ten_crop_resize


def test_ten_crops_are_the_corners_the_centre_and_their_mirrors() -> None:
    image = photo(400, 300)
    (crops,) = list(looks(image, IMAGENET, "ten_crop"))
    assert crops.shape == (10, 3, 224, 224)
    assert ten_crop_resize(IMAGENET) == 256
    # The mirror image's top-left corner is the mirrored top-right one of the image.
    assert torch.equal(crops[5], crops[1].flip(2))
    centre = torch.from_numpy(IMAGENET.image(image))
    assert torch.equal(crops[4], centre)  # the centre crop is the declared preprocessing's


def test_multi_scale_sees_the_whole_image_at_the_papers_shorter_sides() -> None:
    batches = list(looks(photo(400, 300), IMAGENET, "multi_scale"))
    assert [min(batch.shape[2:]) for batch in batches] == list(PAPER_SCALES)
    assert all(batch.shape[0] == 2 for batch in batches)  # the image and its mirror
    assert batches[-1].shape[2:] == (640, 853)  # the aspect is kept
    small = Preprocessing((32, 32), 32, "bilinear", 3, (0.5,) * 3, (0.25,) * 3)
    assert [min(b.shape[2:]) for b in looks(photo(40, 32), small, "multi_scale")] == [
        32, 37, 55, 69, 91,
    ]  # fmt: skip


@pytest.fixture(scope="module")
def digits_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("views")
    spec = TrainSpec.model_validate(
        {
            "model": {"name": "resnet8"},
            "dataset": {"name": "digits", "validation": 0},
            "recipe": {"epochs": 2, "batch_size": 64, "augment": False},
        }
    )
    fit(spec, load_dataset(spec.dataset, data_root=root), RunOptions(out_dir=root), RecordingSink())
    return root / "checkpoints" / "best.pt"


def test_the_center_view_scores_as_the_batched_engine(digits_run: Path) -> None:
    trained = load_trained_model(digits_run)
    data = load_dataset(TrainSpec.model_validate(
        {"model": {"name": "resnet8"}, "dataset": {"name": "digits", "validation": 0}}
    ).dataset, data_root=digits_run.parent)  # fmt: skip
    cpu = torch.device("cpu")
    batched = make_batches(
        data.test, trained.info, batch_size=64, device=cpu, augment=False,
        shuffle=False, drop_last=False, seed=0,
    )  # fmt: skip
    engine = evaluate(trained.model, batched, trained.info.num_classes)
    viewed = evaluate_views(
        trained.model, data.test, trained.preprocessing, "center",
        num_classes=trained.info.num_classes, device=cpu,
    )  # fmt: skip
    assert viewed.confusion == engine.confusion
    assert viewed.loss == pytest.approx(engine.loss, rel=1e-4)


def test_an_evaluation_says_which_view_made_it(digits_run: Path) -> None:
    dataset = TrainSpec.model_validate(
        {"model": {"name": "resnet8"}, "dataset": {"name": "digits", "validation": 0}}
    ).dataset
    sha256 = checkpoints.sha256_of(digits_run)
    center = evaluate_checkpoint(digits_run, dataset, data_root=digits_run.parent, sha256=sha256)
    ten = evaluate_checkpoint(digits_run, dataset, data_root=digits_run.parent, view="ten_crop")
    multi = evaluate_checkpoint(
        digits_run, dataset, data_root=digits_run.parent, view="multi_scale"
    )
    assert (center.view, ten.view, multi.view) == ("center", "ten_crop", "multi_scale")
    assert center.count == ten.count == multi.count == 359
    # Other looks at the same images: close to the centre's error, not equal to it.
    assert abs(ten.error - center.error) < 0.2
    assert ten.loss != center.loss


def test_a_gray_image_is_seen_in_one_channel() -> None:
    gray = Preprocessing((16, 16), 18, "bilinear", 1, (0.5,), (0.25,))
    (crops,) = list(looks(Image.new("L", (30, 20), 128), gray, "ten_crop"))
    assert crops.shape == (10, 1, 16, 16)


def test_looks_stacked_across_images_score_as_each_image_alone() -> None:
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
        torch.nn.Linear(4, 5),
    ).eval()  # fmt: skip

    def forward(batch: torch.Tensor) -> torch.Tensor:
        probabilities: torch.Tensor = net(batch.float() / 255).softmax(1)
        return probabilities

    small = Preprocessing((32, 32), 32, "bilinear", 3, (0.5,) * 3, (0.25,) * 3)
    # Photos of two aspects: their multi-scale looks come in sizes the others share or not.
    images = [
        list(looks(photo(w, h), small, "multi_scale")) for w, h in [(40, 32), (32, 40), (40, 32)]
    ]
    alone = torch.stack([torch.cat([forward(b) for b in batches]).mean(0) for batches in images])
    with torch.no_grad():
        stacked = mean_of_looks(forward, images)
        assert stacked.shape == (3, 5)
        assert torch.allclose(stacked, alone.detach(), atol=1e-6)


def test_a_split_is_scored_the_same_in_groups_of_any_size(
    digits_run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trained = load_trained_model(digits_run)
    data = load_dataset(TrainSpec.model_validate(
        {"model": {"name": "resnet8"}, "dataset": {"name": "digits", "validation": 0}}
    ).dataset, data_root=digits_run.parent)  # fmt: skip
    cpu = torch.device("cpu")

    def score() -> tuple[list[list[int]], float]:
        viewed = evaluate_views(
            trained.model, data.test, trained.preprocessing, "ten_crop",
            num_classes=trained.info.num_classes, device=cpu,
        )  # fmt: skip
        return viewed.confusion, viewed.loss

    grouped = score()
    monkeypatch.setattr("training.views.LOOK_PIXELS", 1)  # one image a forward
    confusion, loss = score()
    assert confusion == grouped[0]
    assert loss == pytest.approx(grouped[1], rel=1e-5)

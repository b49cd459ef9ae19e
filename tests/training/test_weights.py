"""Weights from elsewhere: read safely, mapped onto the zoo's nets, checked, converted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torchvision
from safetensors.torch import save_file

import models
from training import checkpoints, weights
from training.preprocess import preprocessing_of
from training.runs import load_trained_model


class Payload:
    """A class a pickle names: loading it would build an object of code of the file's."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (print, ("unpickled",))


def seeded_torchvision(depth: int = 18, num_classes: int = 1000) -> torch.nn.Module:
    """torchvision's ResNet with seeded weights and non-trivial batch-norm statistics."""
    torch.manual_seed(0)
    net: torch.nn.Module = getattr(torchvision.models, f"resnet{depth}")(num_classes=num_classes)
    for key, value in net.state_dict().items():
        if key.endswith("running_mean"):
            value.uniform_(-0.1, 0.1)
        elif key.endswith("running_var"):
            value.uniform_(0.5, 1.5)
    return net.eval()


def akamaster_file(path: Path, net: torch.nn.Module) -> Path:
    """Our net's weights saved as akamaster's trainer saves them (DataParallel, `linear`)."""
    state = {
        "module." + key.replace("fc.", "linear.", 1)
        if key.startswith("fc.")
        else "module." + key: v
        for key, v in net.state_dict().items()
        if not key.endswith("num_batches_tracked")  # as files before PyTorch 0.4.1
    }
    torch.save({"best_prec1": 91.25, "state_dict": state}, path)
    return path


def test_a_torchvision_state_dict_converts_and_matches_torchvisions_outputs(
    tmp_path: Path,
) -> None:
    reference = seeded_torchvision()
    path = tmp_path / "resnet18.pth"
    torch.save(reference.state_dict(), path)
    read = weights.read(path)
    assert read.format == "torchvision"
    imported = weights.convert(
        read,
        architecture="resnet18",
        options={},
        classes=None,
        preprocessing=None,
        file_name=path.name,
        source_sha256=checkpoints.sha256_of(path),
    )
    facts = imported.facts
    assert facts["checked_against"] == "torchvision"
    assert facts["max_abs_diff"] <= weights.TOLERANCE
    assert facts["keys"] == len(reference.state_dict())
    saved = tmp_path / "imported.pt"
    torch.save(imported.checkpoint, saved)
    trained = load_trained_model(saved)
    assert trained.info.classes[:2] == ("tench", "goldfish")
    assert preprocessing_of(torch.load(saved, weights_only=True)).resize == 256
    batch = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(trained.model(batch), reference(batch), atol=1e-5, rtol=1e-5)


def test_an_akamaster_file_maps_onto_our_resnet20(tmp_path: Path) -> None:
    torch.manual_seed(1)
    ours = models.build("resnet20", num_classes=10).eval()
    read = weights.read(akamaster_file(tmp_path / "resnet20-12fca82f.th", ours))
    assert read.format == "akamaster"
    assert set(read.state) == set(ours.state_dict())
    assert torch.equal(read.state["fc.weight"], ours.state_dict()["fc.weight"])
    net = weights.load_into("resnet20", read.state, 10, {})
    batch = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(net(batch), ours(batch))
    assert weights.default_classes("resnet20", read.state) == weights.CIFAR10_CLASSES
    # akamaster's training normalised by ImageNet's statistics; a CIFAR net otherwise CIFAR-10's
    assert weights.default_preprocessing("resnet20", "akamaster").mean == weights.IMAGENET_MEAN
    plain = weights.default_preprocessing("resnet20", "safetensors")
    assert (plain.crop, plain.resize, plain.mean) == ((32, 32), None, weights.CIFAR10_MEAN)


def test_a_safetensors_file_is_read_by_its_content(tmp_path: Path) -> None:
    state = seeded_torchvision().state_dict()
    path = tmp_path / "weights.bin"  # no telling suffix
    save_file({key: value.contiguous() for key, value in state.items()}, path)
    read = weights.read(path)
    assert read.format == "safetensors"
    assert torch.equal(read.state["conv1.weight"], state["conv1.weight"])


def test_mismatched_keys_and_shapes_are_listed_with_their_counts(tmp_path: Path) -> None:
    path = tmp_path / "resnet18.pth"
    torch.save(seeded_torchvision().state_dict(), path)
    state = weights.read(path).state
    with pytest.raises(weights.MismatchError) as refused:
        weights.load_into("resnet34", state, 1000, {})
    assert refused.value.missing[0] == "layer1.2.conv1.weight"
    assert "missing" in str(refused.value)
    assert str(refused.value).count(",") < 2 * weights.SHOWN + 5  # the first few, not all
    with pytest.raises(weights.MismatchError, match=r"fc.weight \(1000, 512\) vs \(10, 512\)"):
        weights.load_into("resnet18", state, 10, {})


def test_a_pickle_that_names_code_is_refused_unloaded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "evil.pth"
    torch.save({"conv1.weight": torch.zeros(1), "x": Payload()}, path)
    with pytest.raises(weights.UnsafeFileError, match="pickled code"):
        weights.read(path)
    assert "unpickled" not in capsys.readouterr().out


def test_a_format_named_must_be_the_files(tmp_path: Path) -> None:
    path = tmp_path / "resnet18.pth"
    torch.save(seeded_torchvision().state_dict(), path)
    with pytest.raises(weights.WeightsError, match="torchvision file, not akamaster"):
        weights.read(path, "akamaster")
    (tmp_path / "junk.pth").write_bytes(b"not a file of torch")
    with pytest.raises(weights.WeightsError, match=r"not a torch\.save file"):
        weights.read(tmp_path / "junk.pth")


def test_torchvision_weight_enums_give_their_transforms_and_categories_offline() -> None:
    architecture, found = weights.named_weights("ResNet50_Weights.IMAGENET1K_V2")
    assert architecture == "resnet50"
    declared = weights.enum_preprocessing(found)
    assert (declared.crop, declared.resize, declared.interpolation) == ((224, 224), 232, "bilinear")
    assert declared.mean == weights.IMAGENET_MEAN
    assert len(found.meta["categories"]) == 1000
    _, v1 = weights.named_weights("IMAGENET1K_V1", "resnet18")
    assert weights.enum_preprocessing(v1).resize == 256
    with pytest.raises(weights.WeightsError, match="not torchvision weights"):
        weights.named_weights("ResNet50_Weights.NOPE")
    with pytest.raises(weights.WeightsError, match="architecture must be"):
        weights.named_weights("IMAGENET1K_V1", "resnet20")

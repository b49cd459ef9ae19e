"""Weights made elsewhere, read safely, mapped onto the zoo's nets and checked.

Three file formats are read, none of which can run code:

- `torchvision`: a `.pth` state dict as `torch.save(model.state_dict())` writes it. The
  zoo's ImageNet ResNets (resnet18..152) have torchvision's keys and shapes, so it loads
  as it is.
- `akamaster`: the `.th` files of akamaster/pytorch_resnet_cifar10 (option-A CIFAR nets
  resnet20..1202), see `from_akamaster`.
- `safetensors`: a flat table of named tensors (the `safetensors` package), keys as ours.

Pickled files are read with `torch.load(..., weights_only=True)`: anything but tensors,
numbers, strings, lists and dicts is refused before it is built (`UnsafeFileError`).
"""

from __future__ import annotations

import pickle
import re
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

import torch
import torchvision
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import Tensor, nn
from torchvision.models import WeightsEnum

import models
from training.data import DatasetInfo
from training.preprocess import Preprocessing

Format = Literal["torchvision", "akamaster", "safetensors"]
FORMATS: tuple[Format, ...] = get_args(Format)
# The nets torchvision builds under the zoo's own names, key for key.
TORCHVISION_NETS = ("resnet18", "resnet34", "resnet50", "resnet101", "resnet152")
TOLERANCE = 1e-4  # max |ours - torchvision's| over the check's batch
SHOWN = 10  # mismatched keys a refusal lists
_GLOBAL = re.compile(r"Unsupported global: GLOBAL (\S+)")
CIFAR10_CLASSES = (
    *("airplane", "automobile", "bird", "cat", "deer"),
    *("dog", "frog", "horse", "ship", "truck"),
)
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
CIFAR10_MEAN, CIFAR10_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)


class WeightsError(ValueError):
    """A weights file that cannot be read, mapped or checked; the message says why."""


class UnsafeFileError(WeightsError):
    """A pickle that holds code or objects other than tensors: never unpickled."""


class MismatchError(WeightsError):
    """Keys or shapes of a file that differ from the net's: the first of each, and counts."""

    def __init__(self, missing: list[str], unexpected: list[str], shapes: list[str]) -> None:
        self.missing, self.unexpected, self.shapes = missing, unexpected, shapes
        parts = [
            f"{len(found)} {what}: {', '.join(found[:SHOWN])}{' ...' if len(found) > SHOWN else ''}"
            for what, found in (
                ("missing", missing),
                ("unexpected", unexpected),
                ("of another shape (file vs net)", shapes),
            )
            if found
        ]
        super().__init__("the weights do not fit the net: " + "; ".join(parts))


@dataclass(frozen=True)
class Weights:
    """A file's state dict in the zoo's names, and the format it was read as."""

    state: dict[str, Tensor]
    format: Format


def read(path: Path, format: Format | Literal["auto"] = "auto") -> Weights:
    """The state dict of a weights file, in the zoo's names (`WeightsError` if unreadable)."""
    if format == "safetensors" or (format == "auto" and _is_safetensors(path)):
        return Weights(_read_safetensors(path), "safetensors")
    loaded = _load_pickle(path)
    found: Format = "akamaster" if _is_akamaster(loaded) else "torchvision"
    if format not in ("auto", found):
        raise WeightsError(f"the file is a {found} file, not {format}")
    state = from_akamaster(loaded) if found == "akamaster" else _tensors(loaded)
    return Weights(state, found)


def _is_safetensors(path: Path) -> bool:
    """A safetensors file: its name, or 8 bytes of header length and then a JSON object."""
    if path.suffix == ".safetensors":
        return True
    with path.open("rb") as f:
        head = f.read(9)
    return len(head) == 9 and head[8:9] == b"{" and int.from_bytes(head[:8], "little") > 0


def _read_safetensors(path: Path) -> dict[str, Tensor]:
    try:
        return dict(load_file(path, device="cpu"))
    except (SafetensorError, OSError, ValueError) as error:
        raise WeightsError(f"the file is not a readable safetensors file: {error}") from None


def _load_pickle(path: Path) -> Any:
    """`torch.load` with `weights_only=True`: a pickle naming any other global is refused."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        # weights_only refuses every global but tensors' own: code needs one to run.
        named = _GLOBAL.search(str(error))
        if named is None:
            raise WeightsError("the file is not a torch.save file of tensors") from None
        raise UnsafeFileError(
            f"the file's pickle names {named[1]}: it holds pickled code or objects other "
            "than tensors, numbers, strings, lists and dicts, so it was not unpickled"
        ) from None
    except (zipfile.BadZipFile, RuntimeError, EOFError, OSError) as error:
        raise WeightsError(f"the file is not a torch.save file: {error}") from None


def _is_akamaster(loaded: Any) -> bool:
    inner = loaded.get("state_dict") if isinstance(loaded, dict) else None
    return isinstance(inner, dict) and any(str(key).startswith("module.") for key in inner)


def _tensors(loaded: Any) -> dict[str, Tensor]:
    """A state dict of tensors (a checkpoint-like {"state_dict": ...} is unwrapped)."""
    if isinstance(loaded, dict) and isinstance(loaded.get("state_dict"), dict):
        loaded = loaded["state_dict"]
    if not isinstance(loaded, dict) or not loaded:
        raise WeightsError("the file holds no state dict (a dict of names to tensors)")
    others = [str(key) for key, value in loaded.items() if not isinstance(value, Tensor)]
    if others:
        raise WeightsError(f"the state dict has values that are not tensors: {others[:SHOWN]}")
    return {str(key): value for key, value in loaded.items()}


def from_akamaster(loaded: Mapping[str, Any]) -> dict[str, Tensor]:
    """An akamaster/pytorch_resnet_cifar10 `.th` file's weights in the zoo's names.

    Its file is `{"state_dict": ..., "best_prec1": ...}`, saved from an `nn.DataParallel`,
    so every key starts with `module.`. Beneath it the names are torchvision-style and
    equal ours (`conv1`, `bn1`, `layer1.0.conv1`, `layer1.0.bn2`, ...): its option-A
    shortcut (zero-padded identity) has no weights, as ours has none. Its classifier is
    `linear`, ours `fc`. Files written before PyTorch 0.4.1 lack the batch norms'
    `num_batches_tracked`, which only counts training steps: those are filled in as 0.
    """
    state = _tensors(loaded.get("state_dict"))
    mapped: dict[str, Tensor] = {}
    for key, value in state.items():
        name = key.removeprefix("module.")
        mapped["fc." + name.removeprefix("linear.") if name.startswith("linear.") else name] = value
    for key in [k for k in mapped if k.endswith(".running_mean")]:
        mapped.setdefault(key.replace(".running_mean", ".num_batches_tracked"), torch.tensor(0))
    return mapped


def mismatches(state: Mapping[str, Tensor], net: nn.Module) -> MismatchError | None:
    """How `state` differs from `net`'s state dict (missing, unexpected, other shapes), or
    None when it fits."""
    expected = net.state_dict()
    shapes = [
        f"{key} {tuple(value.shape)} vs {tuple(expected[key].shape)}"
        for key, value in state.items()
        if key in expected and value.shape != expected[key].shape
    ]
    missing = [key for key in expected if key not in state]
    unexpected = [key for key in state if key not in expected]
    return MismatchError(missing, unexpected, shapes) if missing or unexpected or shapes else None


def load_into(
    architecture: str, state: Mapping[str, Tensor], num_classes: int, options: dict[str, Any]
) -> nn.Module:
    """The zoo's net with `state` loaded strictly, in eval mode; `MismatchError` if it differs."""
    try:
        net = models.build(architecture, num_classes=num_classes, **options)
    except ValueError as error:
        raise WeightsError(str(error)) from None
    found = mismatches(state, net)
    if found:
        raise found
    net.load_state_dict(state, strict=True)
    return net.eval()


def output_classes(state: Mapping[str, Tensor]) -> int | None:
    """How many classes the file's classifier (`fc`) answers, if it has one."""
    weight = state.get("fc.weight")
    return int(weight.shape[0]) if weight is not None and weight.ndim == 2 else None


def checks_against_torchvision(architecture: str, options: Mapping[str, Any]) -> bool:
    """Whether torchvision builds this very net (its name, and no option of ours changed)."""
    return architecture in TORCHVISION_NETS and not options


def torchvision_difference(
    architecture: str, state: Mapping[str, Tensor], ours: nn.Module, size: int = 64
) -> float:
    """Max |ours - torchvision's| over a seeded batch, with the same weights in both."""
    num_classes = output_classes(state) or 1000
    theirs = getattr(torchvision.models, architecture)(weights=None, num_classes=num_classes)
    theirs.load_state_dict(state, strict=True)
    generator = torch.Generator().manual_seed(0)
    batch = torch.randn(2, 3, size, size, generator=generator)
    with torch.no_grad():
        return float((ours(batch) - theirs.eval()(batch)).abs().max())


def default_classes(architecture: str, state: Mapping[str, Tensor]) -> tuple[str, ...]:
    """The classes a file's net answers when none are given: ImageNet's 1000 for an
    ImageNet net with 1000 outputs, CIFAR-10's for a CIFAR net with 10."""
    count = output_classes(state)
    imagenet = models.parse_name(architecture).stem == "imagenet"
    if imagenet and count == 1000:
        return imagenet_categories()
    if not imagenet and count == 10:
        return CIFAR10_CLASSES
    raise WeightsError(
        f"the file's classifier answers {count} classes: name them (classes, a JSON list)"
    )


def imagenet_categories() -> tuple[str, ...]:
    """The 1000 ImageNet class names torchvision's weight enums carry (no download)."""
    return tuple(torchvision.models.ResNet50_Weights.IMAGENET1K_V1.meta["categories"])


def default_preprocessing(architecture: str, format: Format) -> Preprocessing:
    """What an imported net expects when nothing is said: torchvision's ImageNet transforms
    (shorter side 256, centre 224, bilinear, ImageNet statistics) for an ImageNet net; a
    32x32 image, not resized, for a CIFAR net, with CIFAR-10's statistics, but akamaster's
    training normalised by ImageNet's (its `trainer.py`), so its files keep those."""
    if models.parse_name(architecture).stem == "imagenet":
        return Preprocessing((224, 224), 256, "bilinear", 3, IMAGENET_MEAN, IMAGENET_STD)
    mean, std = (
        (IMAGENET_MEAN, IMAGENET_STD) if format == "akamaster" else (CIFAR10_MEAN, CIFAR10_STD)
    )
    return Preprocessing((32, 32), None, "bilinear", 3, mean, std)


def named_weights(name: str, architecture: str | None = None) -> tuple[str, WeightsEnum]:
    """A torchvision weight enum by its name ("ResNet50_Weights.IMAGENET1K_V2", or
    "IMAGENET1K_V2" with its architecture), and the zoo name of its net."""
    try:
        if "." in name:
            weights = torchvision.models.get_weight(name)
            architecture = next(
                net
                for net in TORCHVISION_NETS
                if torchvision.models.get_model_weights(net) is type(weights)
            )
        elif architecture in TORCHVISION_NETS:
            weights = torchvision.models.get_model_weights(architecture)[name]
        else:
            raise WeightsError(f"architecture must be one of {', '.join(TORCHVISION_NETS)}")
    except (KeyError, ValueError, StopIteration) as error:
        if isinstance(error, WeightsError):
            raise
        raise WeightsError(
            f"weights {name!r} are not torchvision weights of {', '.join(TORCHVISION_NETS)}"
        ) from None
    return architecture, weights


def enum_preprocessing(weights: WeightsEnum) -> Preprocessing:
    """A torchvision weight enum's transforms as a preprocessing record (no download)."""
    transforms = weights.transforms()
    (crop,), (resize,) = transforms.crop_size, transforms.resize_size
    interpolation = transforms.interpolation.value
    return Preprocessing(
        (crop, crop), resize, interpolation, 3, tuple(transforms.mean), tuple(transforms.std)
    )


def declared_preprocessing(
    default: Preprocessing, overrides: Mapping[str, Any] | None
) -> Preprocessing:
    """`default` with the fields of `overrides` (crop, resize, interpolation, mean, std) in
    its place; a crop may be one size (square) or [height, width]."""
    record = default.to_record() | dict(overrides or {})
    if isinstance(record["crop"], int):
        record["crop"] = [record["crop"], record["crop"]]
    try:
        return Preprocessing.from_record(record)
    except (KeyError, TypeError, ValueError) as error:
        raise WeightsError(f"preprocessing: {error}") from None


@dataclass(frozen=True)
class Imported:
    """Converted weights: the checkpoint to store, and what the import found."""

    checkpoint: dict[str, Any]
    facts: dict[str, Any]
    params: int


def convert(
    weights: Weights,
    *,
    architecture: str,
    options: dict[str, Any],
    classes: tuple[str, ...] | None,
    preprocessing: Mapping[str, Any] | None,
    file_name: str,
    source_sha256: str,
) -> Imported:
    """Load the weights into the zoo's net, check them against torchvision's own net where
    it has one, and make the service's checkpoint of them (`preprocessing`: the fields that
    differ from the default's)."""
    names = classes or default_classes(architecture, weights.state)
    net = load_into(architecture, weights.state, len(names), options)
    difference: float | None = None
    if checks_against_torchvision(architecture, options):
        difference = torchvision_difference(architecture, weights.state, net)
        if not difference <= TOLERANCE:
            raise WeightsError(
                f"{architecture} with these weights differs from torchvision's by {difference:.3g} "
                f"(over {TOLERANCE:g}); the file is not a torchvision {architecture}"
            )
    declared = declared_preprocessing(
        default_preprocessing(architecture, weights.format), preprocessing
    )
    info = DatasetInfo(
        f"imported:{file_name}",
        names,
        declared.channels,
        declared.crop,
        declared.mean,
        declared.std,
    )
    facts = {
        "format": weights.format,
        "source_sha256": source_sha256,
        "file_name": file_name,
        "architecture": architecture,
        "keys": len(weights.state),
        "checked_against": "torchvision" if difference is not None else None,
        "max_abs_diff": difference,
    }
    checkpoint = {
        "format": 1,
        "model": net.state_dict(),
        "spec": {"model": {"name": architecture, "options": options}},
        "data": info.to_record(),
        "preprocessing": declared.to_record(),
        "imported": facts,
    }
    return Imported(checkpoint, facts, sum(p.numel() for p in net.parameters()))

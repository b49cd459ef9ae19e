"""Fine-tuning: a run that starts from a checkpoint, through the real loop on synthetic data."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from pydantic import ValidationError

from training import checkpoints, finetune
from training.datasets import load_dataset
from training.events import RecordingSink
from training.loop import build_model, fit
from training.options import RunOptions
from training.recipe import make_optimizer, set_lr
from training.specs import TrainSpec


def _spec(
    classes: int = 10, init: dict[str, Any] | None = None, model: str = "resnet8", **recipe: Any
) -> TrainSpec:
    return TrainSpec.model_validate(
        {
            "model": {"name": model},
            "dataset": {
                "name": "synthetic",
                "num_classes": classes,
                "image_size": 8,
                "train_size": 64,
                "test_size": 32,
                "validation": 0,
            },
            "recipe": {
                "batch_size": 16,
                "iterations": 8,
                "log_every": 2,
                "checkpoint_every": 4,
                "eval_every": 4,
                **recipe,
            },
            "init": init,
        }
    )


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 10-class ResNet-8 trained for 8 steps: the checkpoint fine-tunes start from."""
    root = tmp_path_factory.mktemp("source")
    spec = _spec(seed=7)
    fit(spec, load_dataset(spec.dataset, data_root=root), RunOptions(out_dir=root), RecordingSink())
    return root / "checkpoints" / "best.pt"


def _state(path: Path) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = checkpoints.load(path)["model"]
    return state


def _started(spec: TrainSpec, tmp_path: Path) -> tuple[TrainSpec, torch.nn.Module]:
    """The spec as used and the net of a fresh fine-tune, before any step."""
    data = load_dataset(spec.dataset, data_root=tmp_path)
    used, info, read = finetune.start(spec, data.info, None)
    model = build_model(used.model, info)
    finetune.prepare(model, used.init, read)
    return used, model


def test_weights_are_carried_over_exactly_when_the_classes_are_the_same(
    source: Path, tmp_path: Path
) -> None:
    used, model = _started(_spec(init={"source": str(source)}), tmp_path)
    expected = _state(source)
    assert used.init is not None
    assert used.init.head == "keep"
    for key, value in model.state_dict().items():
        assert torch.equal(value, expected[key]), key
    pinned = used.init.resolved
    assert pinned is not None
    assert pinned.sha256 == checkpoints.sha256_of(source)
    assert (pinned.step, pinned.classes, pinned.path) == (8, 10, str(source.resolve()))


def test_the_head_is_replaced_for_another_class_count(source: Path, tmp_path: Path) -> None:
    used, model = _started(_spec(classes=5, init={"source": str(source)}), tmp_path)
    expected = _state(source)
    assert used.init is not None
    assert used.init.head == "reset"
    state = model.state_dict()
    assert state["fc.weight"].shape == (5, expected["fc.weight"].shape[1])
    assert all(torch.equal(state[k], v) for k, v in expected.items() if not k.startswith("fc."))
    line = finetune.describe(used.init, load_dataset(used.dataset, data_root=tmp_path).info)
    assert line.startswith(f"fine-tuning from {source} (step 8)")
    assert "(head replaced: 10 -> 5 classes; frozen: none;" in line


def test_keeping_the_head_of_another_class_count_is_refused(source: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"init\.head 'keep' needs the source's 10 classes"):
        _started(_spec(classes=5, init={"source": str(source), "head": "keep"}), tmp_path)


def test_another_net_than_the_sources_is_refused(source: Path, tmp_path: Path) -> None:
    spec = _spec(init={"source": str(source)}, model="resnet14")
    with pytest.raises(ValueError, match=r"model resnet14 is not the net of .*\(resnet8\)"):
        _started(spec, tmp_path)


def test_a_stage_the_net_lacks_is_refused() -> None:
    with pytest.raises(ValidationError, match=r"resnet8 has 3 stages .* layer4 is none of them"):
        _spec(init={"source": "x.pt", "freeze": ["layer4"]})


def test_frozen_stages_and_their_batch_norm_statistics_do_not_move(
    source: Path, tmp_path: Path
) -> None:
    init = {"source": str(source), "freeze": "stem,layer1"}
    spec = _spec(classes=5, init=init, augment=False)
    sink = RecordingSink()
    fit(spec, load_dataset(spec.dataset, data_root=tmp_path), RunOptions(out_dir=tmp_path), sink)
    before, after = _state(source), _state(tmp_path / "checkpoints" / "step-8.pt")
    frozen = [k for k in after if k.split(".")[0] in ("conv1", "bn1", "layer1")]
    assert any(k.endswith("running_mean") for k in frozen)
    for key in frozen:
        assert torch.equal(after[key], before[key]), key
    assert not torch.equal(after["layer2.0.conv1.weight"], before["layer2.0.conv1.weight"])
    assert not torch.equal(after["layer2.0.bn1.running_mean"], before["layer2.0.bn1.running_mean"])
    messages = [message for _, message in sink.events]
    assert "(head replaced: 10 -> 5 classes; frozen: stem, layer1;" in messages[1]


def test_frozen_batch_norms_stay_in_eval_mode_through_train(source: Path, tmp_path: Path) -> None:
    _, model = _started(_spec(init={"source": str(source), "freeze": ["stem"]}), tmp_path)
    model.train()
    assert not model.get_submodule("bn1").training
    assert model.get_submodule("layer1.0.bn1").training


def test_the_backbone_trains_at_its_share_of_the_lr(source: Path, tmp_path: Path) -> None:
    init = {"source": str(source), "backbone_lr": 0.1, "freeze": ["stem"]}
    used, model = _started(_spec(classes=5, init=init), tmp_path)
    optimizer = make_optimizer(used.recipe, model, finetune.param_groups(model, used.init))
    set_lr(optimizer, 0.05)
    head, backbone = optimizer.param_groups
    assert head["params"] == [model.get_parameter("fc.weight"), model.get_parameter("fc.bias")]
    assert (head["lr"], backbone["lr"]) == (0.05, pytest.approx(0.005))
    trained = {id(p) for p in backbone["params"]}
    assert id(model.get_parameter("conv1.weight")) not in trained  # frozen: in no group
    assert id(model.get_parameter("layer1.0.conv1.weight")) in trained


def test_a_fine_tune_normalises_as_its_source(source: Path, tmp_path: Path) -> None:
    spec = _spec(classes=5, init={"source": str(source)}, iterations=2)
    fit(
        spec,
        load_dataset(spec.dataset, data_root=tmp_path),
        RunOptions(out_dir=tmp_path),
        RecordingSink(),
    )
    saved = checkpoints.load(tmp_path / "checkpoints" / "step-2.pt")
    assert saved["data"]["mean"] == checkpoints.load(source)["data"]["mean"]
    assert saved["preprocessing"]["std"] == checkpoints.load(source)["data"]["std"]
    assert saved["spec"]["init"]["resolved"]["sha256"] == checkpoints.sha256_of(source)


def test_a_resumed_fine_tune_continues_its_own_checkpoint_not_the_init(
    source: Path, tmp_path: Path
) -> None:
    copy = tmp_path / "init.pt"
    copy.write_bytes(source.read_bytes())
    spec = _spec(classes=5, init={"source": str(copy), "backbone_lr": 0.5})
    data = load_dataset(spec.dataset, data_root=tmp_path)
    whole = fit(spec, data, RunOptions(out_dir=tmp_path / "whole"), RecordingSink())
    fit(spec, data, RunOptions(out_dir=tmp_path / "split"), RecordingSink(stop_at=4))
    copy.unlink()  # the resumed half must not need it
    second = RecordingSink()
    resumed = fit(spec, data, RunOptions(out_dir=tmp_path / "split"), second)
    assert second.events[0][1] == "resumed from step-4.pt at step 4"
    assert resumed["final_test_error"] == whole["final_test_error"]
    assert torch.equal(
        _state(tmp_path / "split" / "checkpoints" / "step-8.pt")["fc.weight"],
        _state(tmp_path / "whole" / "checkpoints" / "step-8.pt")["fc.weight"],
    )

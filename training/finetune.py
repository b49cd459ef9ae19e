"""Fine-tuning: a fresh run that starts from another run's (or imported) weights.

A train spec's `init` names the checkpoint. When the run starts fresh, its weights are
loaded into the net built for the new data (strictly, but for a classifier that is
replaced), the frozen stages keep their weights and batch-norm statistics, and every
pretrained weight trains at `backbone_lr` times the recipe's lr. A resumed fine-tune
continues from its own checkpoint and never reads the init again. The spec as used
records the checkpoint (job, version, step, sha256) and the head decision.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import Tensor, nn

import models
from training import checkpoints
from training.data import DatasetInfo
from training.preprocess import Preprocessing, preprocessing_of
from training.specs import InitSpec, ModelSpec, PinnedInit, TrainSpec

HEAD = "fc"  # the classifier's module (models.ResNet)
STEM = ("conv1", "bn1")


@dataclass(frozen=True)
class Source:
    """An init checkpoint as read: its weights, its net, its data and its preprocessing."""

    state: dict[str, Tensor]
    model: ModelSpec
    info: DatasetInfo
    preprocessing: Preprocessing
    path: Path
    sha256: str
    step: int | None


class EvalBatchNorm2d(nn.BatchNorm2d):
    """A batch norm that stays in eval mode: a frozen stage's statistics stay the source's.

    The loop and `evaluate` switch the net's mode back and forth; `train()` here does not."""

    def train(self, mode: bool = True) -> EvalBatchNorm2d:
        super().train(False)
        return self


def read_source(init: InitSpec) -> Source:
    """The init checkpoint: the pinned file (the service's, fetched) or `source` as a path,
    verified by the pinned sha256 where there is one."""
    pinned = init.resolved
    path = Path(pinned.path if pinned is not None and pinned.path else init.source).expanduser()
    if not path.is_file():
        raise ValueError(f"init checkpoint {path} does not exist")
    sha256 = pinned.sha256 if pinned is not None else None
    saved = checkpoints.load(path, sha256=sha256)
    try:
        model = ModelSpec.model_validate(saved["spec"]["model"])
        info = DatasetInfo.from_record(saved["data"])
        state = saved["model"]
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(f"init checkpoint {path} names no net and data: {error}") from None
    step = saved.get("step")
    return Source(
        state=state,
        model=model,
        info=info,
        preprocessing=preprocessing_of(saved),
        path=path,
        sha256=sha256 or checkpoints.sha256_of(path),
        step=step if isinstance(step, int) else None,
    )


def weights_of(spec: ModelSpec) -> models.Architecture:
    """What a net's weights are shaped by: its architecture, less how it was initialised."""
    arch = models.resolve(spec.name, **spec.options)
    return dataclasses.replace(arch, zero_init_residual=False)


def check_model(model: ModelSpec, source: ModelSpec, source_name: str) -> None:
    """ValueError unless `model` is the source's net (name and options)."""
    if weights_of(model) != weights_of(source):
        raise ValueError(
            f"model {_named(model)} is not the net of {source_name} ({_named(source)}); a "
            f"fine-tune keeps the source's net: set model to {source.model_dump(mode='json')}"
        )


def _named(spec: ModelSpec) -> str:
    options = ", ".join(f"{k}={v}" for k, v in sorted(spec.options.items()))
    return f"{spec.name}({options})" if options else spec.name


def head_of(init: InitSpec, source: DatasetInfo, info: DatasetInfo) -> str:
    """ "keep" or "reset": auto replaces the classifier when the classes differ."""
    if init.head == "keep" and source.num_classes != info.num_classes:
        raise ValueError(
            f"init.head 'keep' needs the source's {source.num_classes} classes; {info.name} "
            f"has {info.num_classes} (use head 'auto' or 'reset')"
        )
    if init.head != "auto":
        return init.head
    return "keep" if source.classes == info.classes else "reset"


def init_as_used(init: InitSpec, source: Source, info: DatasetInfo) -> InitSpec:
    """The init as the run uses it: its head decided and its checkpoint pinned."""
    given = init.resolved or PinnedInit()
    pinned = given.model_copy(
        update={
            "path": given.path or str(source.path.resolve()),
            "sha256": source.sha256,
            "step": source.step if given.step is None else given.step,
            "classes": source.info.num_classes,
        }
    )
    head = head_of(init, source.info, info)
    return init.model_copy(update={"head": head, "resolved": pinned})


def start(
    spec: TrainSpec, info: DatasetInfo, restored: dict[str, Any] | None
) -> tuple[TrainSpec, DatasetInfo, Source | None]:
    """The spec and data info a run uses, and the weights it starts from (None: a plain run,
    or a resumed one, which continues from its own checkpoint and its normalisation)."""
    if restored is not None:
        kept = TrainSpec.model_validate(restored["spec"]).init
        if kept is None:
            return spec.model_copy(update={"init": None}), info, None
        used = DatasetInfo.from_record(restored["data"])
        return spec.model_copy(update={"init": kept}), _normalised(info, used.mean, used.std), None
    if spec.init is None:
        return spec, info, None
    source = read_source(spec.init)
    check_model(spec.model, source.model, f"init checkpoint {source.path.name}")
    if source.info.channels != info.channels:
        raise ValueError(
            f"the init checkpoint takes {source.info.channels}-channel images; {info.name} "
            f"has {info.channels}"
        )
    mean, std = normalisation(spec.init, source.preprocessing, info)
    init = init_as_used(spec.init, source, info)
    return spec.model_copy(update={"init": init}), _normalised(info, mean, std), source


def normalisation(
    init: InitSpec, source: Preprocessing, info: DatasetInfo
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """The mean and std a fine-tune normalises by: the source's (its declared preprocessing,
    as torchvision's fine-tuning recipes do), or the new data's with `normalisation: data`."""
    if init.normalisation == "data":
        return info.mean, info.std
    return source.mean, source.std


def _normalised(info: DatasetInfo, mean: tuple[float, ...], std: tuple[float, ...]) -> DatasetInfo:
    return dataclasses.replace(info, mean=tuple(mean), std=tuple(std))


def prepare(model: models.ResNet, init: InitSpec | None, source: Source | None) -> None:
    """Load the source's weights into a fresh run's net, and freeze the frozen stages (a
    resumed run's too: its checkpoint then overwrites the weights)."""
    if init is None:
        return
    if source is not None:
        load_weights(model, source.state, replace_head=init.head == "reset")
    freeze(model, init.freeze)


def load_weights(model: nn.Module, state: dict[str, Tensor], *, replace_head: bool) -> None:
    """Every weight from `state`, strictly; a replaced classifier keeps its fresh init."""
    if not replace_head:
        model.load_state_dict(state)
        return
    kept = {key: value for key, value in state.items() if not _is_head(key)}
    missing, unexpected = model.load_state_dict(kept, strict=False)
    wrong = sorted(set(missing) - {key for key in model.state_dict() if _is_head(key)})
    if wrong or unexpected:
        raise ValueError(
            f"the init checkpoint does not fit the net: missing {wrong}, unexpected {unexpected}"
        )


def _is_head(key: str) -> bool:
    return key.split(".", 1)[0] == HEAD


def stage_modules(model: models.ResNet, stages: tuple[str, ...]) -> list[nn.Module]:
    """The modules of the named stages; the last stage takes the final activation."""
    last = model.num_stages
    named = {name for name in stages if name != "all_but_head"}
    if "all_but_head" in stages:
        named |= {"stem", *(f"layer{i}" for i in range(1, last + 1))}
    found: list[nn.Module] = []
    for name in sorted(named):
        if name == "stem":
            found += [model.get_submodule(part) for part in STEM]
        else:
            found.append(model.get_submodule(name))
            if name == f"layer{last}":
                found.append(model.final_act)
    return found


def freeze(model: models.ResNet, stages: tuple[str, ...]) -> None:
    """Keep the stages fixed: no gradients, and their batch norms in eval mode for good."""
    frozen = stage_modules(model, stages)
    for module in frozen:
        module.requires_grad_(False)
    targets = {id(module) for top in frozen for module in top.modules()}
    for name, module in list(model.named_modules()):
        if id(module) in targets and type(module) is nn.BatchNorm2d:
            model.set_submodule(name, _kept_in_eval(module))


def _kept_in_eval(norm: nn.BatchNorm2d) -> EvalBatchNorm2d:
    """The same batch norm (its parameters, statistics and device), kept in eval mode."""
    kept = EvalBatchNorm2d(norm.num_features, norm.eps, norm.momentum, norm.affine)
    kept.load_state_dict(norm.state_dict())
    kept.to(next(norm.buffers()).device)
    kept.requires_grad_(False)
    return kept.eval()


def param_groups(model: nn.Module, init: InitSpec | None) -> list[dict[str, Any]] | None:
    """The optimizer's groups of a fine-tune: a new head at the full lr, every trained
    pretrained weight at `backbone_lr` (its `lr_scale`); frozen weights in none. None: a
    plain run, one group."""
    if init is None:
        return None
    new_head = init.head == "reset"
    head: list[nn.Parameter] = []
    backbone: list[nn.Parameter] = []
    for name, parameter in model.named_parameters():
        if parameter.requires_grad:
            (head if new_head and _is_head(name) else backbone).append(parameter)
    groups = [
        {"params": head, "lr_scale": 1.0},
        {"params": backbone, "lr_scale": init.backbone_lr},
    ]
    return [group for group in groups if group["params"]]


def describe(init: InitSpec, info: DatasetInfo) -> str:
    """One log line: where the weights come from and what of them trains."""
    pinned = init.resolved or PinnedInit()
    where = [f"job {pinned.job_id}"] if pinned.job_id else []
    version = f"{pinned.model}/{pinned.version}"
    if pinned.model and init.source != version:
        where.insert(0, version)
    if pinned.step is not None:
        where.append(f"step {pinned.step}")
    origin = f"{init.source} ({', '.join(where)})" if where else init.source
    head = (
        f"head replaced: {pinned.classes} -> {info.num_classes} classes"
        if init.head == "reset"
        else "head kept"
    )
    facts = [head, f"frozen: {', '.join(init.freeze) or 'none'}"]
    if init.backbone_lr != 1:
        facts.append(f"backbone lr x{init.backbone_lr:g}")
    facts.append(f"normalised as the {init.normalisation}")
    return f"fine-tuning from {origin} ({'; '.join(facts)})"

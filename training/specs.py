"""What a run is: model, dataset and recipe, as closed pydantic models.

The service's job spec reuses these; unknown fields and out-of-range values are rejected
with a message per field. Defaults are the papers' CIFAR recipe (shared/PAPERS.md).
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)

import models

INT32_MAX = 2**31 - 1  # what a Postgres integer column holds
MAX_ITERATIONS = 10_000_000
PAPER_ITERATIONS = 64_000  # 2015 Sec. 4.2: stop at 64k iterations (the default budget)
MAX_CHECKPOINTS = 10_000  # a run's checkpoint writes
Tag = Annotated[str, Field(max_length=200)]
# How training images vary (training.pipeline.Augmentation).
AugmentationRecipe = Literal["cifar", "imagenet_scale", "random_resized_crop"]


class Spec(BaseModel):
    """Base of every spec: closed (unknown fields are errors) and immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelSpec(Spec):
    """A zoo name and its options, checked against the registry."""

    name: str = Field(examples=["resnet20"], max_length=models.MAX_NAME_LENGTH)
    options: dict[str, Any] = Field(
        default_factory=dict, max_length=len(models.OPTIONS), examples=[{"shortcut": "B"}]
    )

    @model_validator(mode="after")
    def _resolves(self) -> ModelSpec:
        try:
            models.resolve(self.name, **self.options)
        except ValueError as error:
            raise ValueError(str(error)) from None
        return self


class _DatasetBase(Spec):
    # Whether a mirror image keeps its class: what `augment_flip: "auto"` follows.
    flip_keeps_label: ClassVar[bool]

    validation: float = Field(
        0.1, ge=0, le=0.5, description="Seeded hold-out fraction of the training split."
    )
    split_seed: int = Field(
        0, ge=0, le=INT32_MAX, description="Seed of the validation (and test) split."
    )
    split: Literal["train", "val", "test"] = Field(
        "test", description="The split an evaluation job reads."
    )
    train_limit: int | None = Field(
        None,
        ge=1,
        le=INT32_MAX,
        description="Use only the first N training images (after the split).",
    )


class Cifar10Spec(_DatasetBase):
    """CIFAR-10 python archive (`cifar-10-python.tar.gz` or its unpacked folder)."""

    name: Literal["cifar10"]
    flip_keeps_label = True  # natural images: the papers flip them


class Cifar100Spec(_DatasetBase):
    """CIFAR-100 python archive (`cifar-100-python.tar.gz` or its unpacked folder)."""

    name: Literal["cifar100"]
    flip_keeps_label = True  # natural images: the papers flip them


class MnistSpec(_DatasetBase):
    """MNIST IDX files, gzipped or not, in torchvision's layout or a plain folder."""

    name: Literal["mnist"]
    flip_keeps_label = False  # a mirrored digit is another digit (2, 5) or none


class FashionMnistSpec(_DatasetBase):
    """Fashion-MNIST IDX files, gzipped or not, in torchvision's layout or a plain folder."""

    name: Literal["fashion_mnist"]
    flip_keeps_label = True  # clothes are left-right symmetric as classes


class DigitsSpec(_DatasetBase):
    """scikit-learn's 8x8 optical digits, always available offline."""

    name: Literal["digits"]
    flip_keeps_label = False  # a mirrored digit is another digit (2, 5) or none
    test_fraction: float = Field(0.2, gt=0, lt=1, description="Seeded test hold-out.")


class ImageFolderSpec(_DatasetBase):
    """A `class/image` tree, or a .zip/.tar/.tar.gz of one, under the data root."""

    name: Literal["imagefolder"]
    flip_keeps_label = True  # natural images, as a rule; augment_flip=false says otherwise
    path: str = Field(description="Folder or archive, relative to the data root.")
    image_size: int | None = Field(
        None,
        ge=8,
        le=1024,
        description="The net's square input: each image's centre crop of this size after "
        "`resize`; default: the images' size when they all have one, else 224.",
    )
    resize: int | None = Field(
        None,
        ge=8,
        le=2048,
        description="The shorter side each image is resized to (aspect kept) before the "
        "centre crop; default: the input size, so nothing of the shorter side is cut "
        "(torchvision's evaluation takes 256 for 224).",
    )
    test_fraction: float = Field(
        0.2,
        gt=0,
        lt=1,
        description="Seeded test hold-out when there are no train/ and test/ or val/ subtrees.",
    )
    in_memory: bool | None = Field(
        None, description="Hold decoded images in memory; default: when they fit."
    )
    bad_files: Literal["fail", "skip"] = Field(
        "fail",
        description="An unreadable image file: fail the load naming it, or skip it (left "
        "out, counted and named in the run's data provenance).",
    )

    @model_validator(mode="after")
    def _crop_fits(self) -> ImageFolderSpec:
        if (
            self.resize is not None
            and self.image_size is not None
            and self.resize < self.image_size
        ):
            raise ValueError(
                f"resize {self.resize} is smaller than image_size {self.image_size}: the "
                "centre crop must fit in the resized image"
            )
        return self

    @field_validator("path")
    @classmethod
    def _relative(cls, value: str) -> str:
        if value.startswith("/") or ".." in value.replace("\\", "/").split("/"):
            raise ValueError("path must be relative to the data root, without '..'")
        return value


class SyntheticSpec(_DatasetBase):
    """Seeded noise around a fixed pattern per class: learnable, for smoke tests only."""

    name: Literal["synthetic"]
    flip_keeps_label = False  # each class is one random pattern; its mirror is no class's
    num_classes: int = Field(10, ge=2, le=1000)
    image_size: int = Field(32, ge=8, le=256)
    channels: Literal[1, 3] = 3
    train_size: int = Field(512, ge=2, le=100_000)
    test_size: int = Field(128, ge=1, le=100_000)


DatasetSpec = Annotated[
    Cifar10Spec
    | Cifar100Spec
    | MnistSpec
    | FashionMnistSpec
    | DigitsSpec
    | ImageFolderSpec
    | SyntheticSpec,
    Field(discriminator="name"),
]


# What `recipe.early_stop` may watch: each lower is better. The val/ and test/ metrics are
# an evaluation's; train/ ones the mean of the latest `log_every` steps before it.
EarlyStopMetric = Literal[
    "val/error",
    "val/loss",
    "val/top5_error",
    "test/error",
    "test/loss",
    "test/top5_error",
    "train/loss",
    "train/error",
]


class EarlyStopSpec(Spec):
    """End a run whose metric stopped improving (a plateau): the run succeeds, saying so."""

    metric: EarlyStopMetric = Field("val/error", description="The metric watched.")
    patience: int = Field(
        3,
        ge=1,
        le=MAX_ITERATIONS,
        description="Evaluations in a row without an improvement before the run ends.",
    )
    min_delta: float = Field(
        0.0,
        ge=0,
        allow_inf_nan=False,
        description="An improvement is a value more than this below the best so far.",
    )


class RecipeSpec(Spec):
    """How to train: the papers' CIFAR recipe by default, every field overridable."""

    iterations: int | None = Field(
        None, ge=1, le=MAX_ITERATIONS, description="Budget in iterations (default 64,000)."
    )
    epochs: float | None = Field(None, gt=0, le=10_000, description="Budget in epochs instead.")
    batch_size: int = Field(128, ge=1, le=65_536)
    optimizer: Literal["sgd", "nesterov", "adamw"] = "sgd"
    lr: float = Field(0.1, gt=0, le=10)
    momentum: float = Field(0.9, ge=0, lt=1)
    weight_decay: float = Field(1e-4, ge=0, le=1)
    schedule: Literal["multistep", "cosine", "onecycle", "constant"] = "multistep"
    milestones: tuple[float, ...] = Field(
        (0.5, 0.75),
        max_length=32,
        description="Multistep: fractions of the budget where lr is divided.",
    )
    gamma: float = Field(0.1, gt=0, le=1, description="Multistep: the factor at each milestone.")
    warmup: Literal["auto", "off", "paper", "linear"] = Field(
        "auto",
        description="paper: lr 0.01 until training error < 80% (ResNet-110 and the 2016 nets); "
        "linear: ramp over warmup_iterations; auto: paper for depth >= 110 and 2016 units.",
    )
    warmup_lr: float = Field(0.01, gt=0, le=10)
    warmup_error: float = Field(0.8, gt=0, le=1)
    warmup_iterations: int = Field(400, ge=1, le=1_000_000)
    label_smoothing: float = Field(0.0, ge=0, lt=1)
    grad_clip: float | None = Field(
        None, gt=0, le=1e6, description="Clip the gradient norm to this."
    )
    augment: bool = Field(True, description="Augment the training images (off: none at all).")
    augmentation: AugmentationRecipe | Literal["auto"] = Field(
        "auto",
        description="cifar: random crops of the zero-padded image (2015 Sec. 4.2); "
        "imagenet_scale: the shorter side resized at random in [256, 480] (scaled to the "
        "input), a random crop (2015 Sec. 3.4); random_resized_crop: torchvision's "
        "(scale 0.08-1, ratio 3/4-4/3); each with flips. auto: random_resized_crop for an "
        "imagefolder of photos (input 64 pixels or more), cifar otherwise.",
    )
    pca_lighting: float = Field(
        0.0,
        ge=0,
        le=1,
        description="imagenet_scale: std of the PCA colour noise (AlexNet's 0.1; 0 is off).",
    )
    augment_pad: Annotated[int, Field(ge=0, le=32)] | Literal["auto"] = Field(
        "auto", description="Pixels of zero padding a side; auto: the image size / 8 (4 at 32)."
    )
    augment_flip: bool | Literal["auto"] = Field(
        "auto", description="Random horizontal flips; auto: where a flip keeps the label."
    )
    seed: int = Field(0, ge=0, le=INT32_MAX)
    mixed_precision: Literal["auto", "bf16", "fp16", "off"] = Field(
        "auto", description="auto: bf16 autocast on CUDA, off on the CPU."
    )
    channels_last: bool | None = Field(
        None, description="Default: the faster memory format on the device."
    )
    compile: bool = Field(False, description="torch.compile the model.")
    log_every: int = Field(50, ge=1, le=100_000, description="Iterations between train metrics.")
    eval_every: int | None = Field(
        None, ge=1, le=MAX_ITERATIONS, description="Iterations; default: every epoch."
    )
    diagnostics_every: int | None = Field(
        None,
        ge=1,
        le=MAX_ITERATIONS,
        description="Iterations between per-block diagnostics; default: 10 per run.",
    )
    checkpoint_every: int | None = Field(
        None,
        ge=1,
        le=MAX_ITERATIONS,
        description="Iterations between checkpoints; default: every epoch. At most "
        f"{MAX_CHECKPOINTS:,} checkpoints a run.",
    )
    keep_last: int = Field(2, ge=1, le=100, description="Checkpoints kept besides the best.")
    early_stop: EarlyStopSpec | None = Field(
        None,
        description="End the run early once a metric stops improving at evaluations; "
        "default: train the whole budget.",
    )

    @field_validator("augment_pad", "augment_flip", mode="wrap")
    @classmethod
    def _auto_or_value(
        cls, value: Any, handler: ValidatorFunctionWrapHandler, info: ValidationInfo
    ) -> Any:
        # One message for the field, not one per member of the union.
        try:
            return handler(value)
        except ValidationError:
            expected = {
                "augment_pad": "must be 'auto' or a whole number of pixels 0..32",
                "augment_flip": "must be 'auto', true or false",
            }
            raise ValueError(expected[info.field_name or ""]) from None

    @model_validator(mode="after")
    def _one_budget(self) -> RecipeSpec:
        if self.iterations is not None and self.epochs is not None:
            raise ValueError("give the budget as iterations or as epochs, not both")
        if any(not 0 < m < 1 for m in self.milestones) or list(self.milestones) != sorted(
            self.milestones
        ):
            raise ValueError("milestones must be increasing fractions of the budget in (0, 1)")
        if self.checkpoint_every is not None and self.epochs is None:
            # Each checkpoint is a file write of the whole net and its optimizer state.
            checkpoints = (self.iterations or PAPER_ITERATIONS) // self.checkpoint_every
            if checkpoints > MAX_CHECKPOINTS:
                raise ValueError(
                    f"checkpoint_every {self.checkpoint_every} makes {checkpoints:,} checkpoints "
                    f"in {self.iterations or PAPER_ITERATIONS:,} iterations, over the limit of "
                    f"{MAX_CHECKPOINTS:,}; checkpoint less often"
                )
        return self


# What `InitSpec.freeze` names: the stem (first conv and its norm), a stage, or all but the
# classifier (the last stage takes the final activation's norm of pre-activation nets).
FreezeStage = Literal["stem", "layer1", "layer2", "layer3", "layer4", "all_but_head"]


class PinnedInit(Spec):
    """The checkpoint an init source named when the run was set up: what it starts from."""

    job_id: uuid.UUID | None = Field(None, description="The service's job of the checkpoint.")
    model: str | None = Field(None, description="The registered model, for a version.")
    version: int | None = Field(None, ge=1, le=INT32_MAX)
    step: int | None = Field(None, ge=0, le=INT32_MAX)
    sha256: str | None = Field(None, pattern=r"^[0-9a-f]{64}$")
    path: str | None = Field(None, max_length=4096, description="The checkpoint file (or key).")
    classes: int | None = Field(None, ge=1, description="The source's classifier outputs.")


class InitSpec(Spec):
    """Where a run's starting weights come from (a fine-tune), and what of them trains."""

    source: str = Field(
        min_length=1,
        max_length=1000,
        description="In the service: a model reference (a train job id: its best checkpoint, "
        "name, name/VERSION, name@ALIAS); run locally: a checkpoint file.",
    )
    head: Literal["auto", "keep", "reset"] = Field(
        "auto",
        description="auto: a new classifier when the classes differ (count or names), the "
        "source's otherwise; keep: the source's; reset: always a new one.",
    )
    freeze: tuple[FreezeStage, ...] = Field(
        (),
        max_length=6,
        description="Stages kept fixed (weights and batch-norm statistics): stem, layer1.., "
        "all_but_head.",
    )
    backbone_lr: float = Field(
        1.0, gt=0, le=1, description="The recipe's lr times this for every pretrained weight."
    )
    normalisation: Literal["source", "data"] = Field(
        "source",
        description="source: normalise as the source's training did (torchvision's fine-tuning "
        "recipes); data: by the new data's statistics.",
    )
    resolved: PinnedInit | None = Field(
        None, description="Filled in on submission (or at the start): the checkpoint used."
    )

    @field_validator("freeze", mode="before")
    @classmethod
    def _listed(cls, value: Any) -> Any:
        # The command line's `-i freeze=stem,layer1`.
        if isinstance(value, str):
            return tuple(v.strip() for v in value.split(",") if v.strip())
        return value


class TrainSpec(Spec):
    """A training run: which net, on which data, with which recipe."""

    kind: Literal["train"] = "train"
    name: str | None = Field(None, max_length=200)
    tags: tuple[Tag, ...] = Field((), max_length=20)
    model: ModelSpec
    dataset: DatasetSpec
    recipe: RecipeSpec = Field(default_factory=RecipeSpec)
    init: InitSpec | None = Field(None, description="Start from these weights (a fine-tune).")

    @model_validator(mode="after")
    def _early_stop_evaluated(self) -> TrainSpec:
        # Only an ImageFolder may bring a validation split of its own (val/ beside test/).
        stop, dataset = self.recipe.early_stop, self.dataset
        if (
            stop is not None
            and stop.metric.startswith("val/")
            and dataset.validation == 0
            and dataset.name != "imagefolder"
        ):
            raise ValueError(
                f"recipe.early_stop.metric {stop.metric} is never evaluated: with "
                "dataset.validation 0 the run has no validation split; hold one out "
                "(e.g. dataset.validation 0.1) or watch test/error"
            )
        return self

    @model_validator(mode="after")
    def _init_stages(self) -> TrainSpec:
        # A frozen stage must be one of the net's (ResNet-20 has layer1..layer3).
        stages = len(models.resolve(self.model.name, **self.model.options).layers)
        names = {"stem", "all_but_head", *(f"layer{i}" for i in range(1, stages + 1))}
        absent = sorted(set(self.init.freeze if self.init else ()) - names)
        if absent:
            raise ValueError(
                f"init.freeze: {self.model.name} has {stages} stages (layer1..layer{stages}); "
                f"{', '.join(absent)} is none of them"
            )
        return self

"""The training loop: reads top to bottom, reports to an `EventSink`, resumes exactly.

No host synchronisation per step: the running loss and error accumulate on the device and
are read every `log_every` steps. A run resumed from its latest checkpoint continues the
same step axis with the same batches, so N steps in one go equal N/2 + N/2 bit for bit.
"""

from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import models
from training import checkpoints, finetune
from training.data import Batches, DatasetInfo, LoadedDataset
from training.diagnostics import BlockProbe
from training.environment import environment
from training.evaluate import Evaluation, evaluate
from training.events import EventSink
from training.pipeline import Augmentation, make_batches, seed_of
from training.preprocess import preprocessing_for
from training.ranks import STOP_EVERY, Ranks
from training.recipe import (
    augment_flip,
    augment_pad,
    augmentation_recipe,
    describe_augmentation,
    learning_rate,
    make_optimizer,
    resolve_defaults,
    set_lr,
    total_iterations,
    uses_paper_warmup,
    warmup_over,
)
from training.specs import ModelSpec, RecipeSpec, TrainSpec

EVAL_BATCH = 512


@dataclass
class LoopState:
    """What the loop carries from step to step, and into a checkpoint."""

    step: int = 0
    warming_up: bool = False
    best_error: float = math.inf  # of the split that selects the best checkpoint
    last_error: float = math.nan
    best_test_error: float = math.inf


class Window:
    """Running sums of training loss and errors, kept on the device between reads."""

    def __init__(self, device: torch.device) -> None:
        self.sums = torch.zeros(3, dtype=torch.float64, device=device)
        self.started = time.perf_counter()

    def add(self, loss: Tensor, errors: Tensor, count: int) -> None:
        self.sums[0] += loss.double() * count
        self.sums[1] += errors
        self.sums[2] += count

    def exclude(self, seconds: float) -> None:
        """Leave time spent outside training steps (evaluation, checkpoints) out of images/s."""
        self.started += seconds

    def gather(self, ranks: Ranks) -> None:
        """Sum every rank's running sums into rank 0's, emptying the others'."""
        ranks.total(self.sums)
        if not ranks.is_main:
            self.sums.zero_()

    def read_and_reset(self) -> tuple[float, float, int, float]:
        """Mean loss, error rate, images and seconds since the last read (one device sync)."""
        loss_sum, error_sum, count = self.sums.tolist()
        elapsed = time.perf_counter() - self.started
        self.sums.zero_()
        self.started = time.perf_counter()
        return loss_sum / max(count, 1), error_sum / max(count, 1), int(count), elapsed


def fit(
    spec: TrainSpec,
    data: LoadedDataset,
    *,
    out_dir: Path,
    sink: EventSink,
    device: torch.device | None = None,
    resume: bool = True,
    free_margin: int = checkpoints.FREE_MARGIN_BYTES,
    ranks: Ranks | None = None,
) -> dict[str, Any]:
    """Train `spec` on `data`, checkpointing to `out_dir/checkpoints`; return the summary.

    The spec as used, its defaults resolved for the data and the device, goes to
    `out_dir/spec.json` and into every checkpoint. A checkpoint is written only with its
    size plus `free_margin` bytes free on its disk (else `checkpoints.DiskFullError`).
    With `ranks`, this process is one rank of a distributed run (`training.ranks`).
    """
    info = data.info
    device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
    main = ranks is None or ranks.is_main
    checkpoint_dir = out_dir / checkpoints.DIRECTORY
    fence: checkpoints.Fence | None = getattr(sink, "fence", None)  # a service sink has one
    # A torn or corrupted newest checkpoint is set aside for the one before (as the worker does).
    warn = functools.partial(sink.on_event, "warning")
    latest = checkpoints.latest_verified(checkpoint_dir, warn=warn) if resume and main else None
    restored = checkpoints.load(latest) if latest is not None else None
    if ranks is not None:
        # Every rank resumes from rank 0's checkpoint, which only rank 0 needs to read.
        latest, restored = ranks.share((latest, restored))
        ranks.check(spec.recipe.batch_size, len(data.train))
    # A fine-tune's weights (a fresh run's) and normalisation (the source's).
    spec, info, source = finetune.start(spec, info, restored)
    given, spec = spec.recipe, _as_used(spec, info, device, restored)
    recipe, channels_last = spec.recipe, bool(spec.recipe.channels_last)
    out_dir.mkdir(parents=True, exist_ok=True)
    if main:
        (out_dir / "spec.json").write_text(spec.model_dump_json(indent=2))
    torch.manual_seed(recipe.seed)
    model = build_model(spec.model, info)
    finetune.prepare(model, spec.init, source)
    model, source = model.to(device), None
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    amp_dtype = autocast_dtype(recipe, device)
    # Fixed shapes every step: let cuDNN pick its fastest kernels once.
    torch.backends.cudnn.benchmark = device.type == "cuda"
    scaler = torch.amp.GradScaler(device.type, enabled=amp_dtype == torch.float16)
    optimizer = make_optimizer(recipe, model, finetune.param_groups(model, spec.init))

    augment = _augmentation(spec, info)
    preprocessing = preprocessing_for(spec.dataset, info)
    record = run_record(data, device)
    if skipped := data.provenance.skipped if data.provenance else ():
        named = ", ".join(file for file, _ in skipped[:5])
        sink.on_event("warning", f"{len(skipped)} unreadable images left out: {named}")
    train_batches = make_batches(
        data.train,
        info,
        batch_size=recipe.batch_size,
        device=device,
        augment=augment,
        shuffle=True,
        drop_last=len(data.train) > recipe.batch_size,
        seed=recipe.seed,
        channels_last=channels_last,
        shard=ranks.shard if ranks is not None else None,
        preprocessing=preprocessing,
    )
    eval_sets = {
        name: make_batches(
            split,
            info,
            batch_size=EVAL_BATCH,
            device=device,
            augment=False,
            shuffle=False,
            drop_last=False,
            seed=recipe.seed,
            channels_last=channels_last,
            preprocessing=preprocessing,
        )
        for name, split in (("val", data.val), ("test", data.test))
        if len(split) > 0 and main
    }
    per_epoch = len(train_batches)
    total = total_iterations(recipe, per_epoch)
    eval_every = recipe.eval_every or per_epoch
    checkpoint_every = recipe.checkpoint_every or per_epoch
    diagnostics_every = recipe.diagnostics_every or max(1, total // 10)

    state = LoopState(warming_up=uses_paper_warmup(recipe, spec.model))
    window = Window(device)
    if latest is not None and restored is not None:
        _restore(restored, model, optimizer, scaler, state, window)
        sink.on_event("info", f"resumed from {latest.name} at step {state.step}")
    else:
        sink.on_event("info", f"training {spec.model.name} on {info.name} for {total} steps")
        if spec.init is not None:
            sink.on_event("info", finetune.describe(spec.init, info))
    sink.on_event("info", describe_augmentation(given, spec))
    sink.on_event("info", f"memory format: {'channels_last' if channels_last else 'NCHW'}")
    if ranks is not None:
        _ready_rank(ranks, window, state.step, recipe.seed)
        sink.on_event("info", describe_ranks(ranks.describe(recipe.batch_size, _backend())))

    def save_checkpoint(*, is_best: bool) -> None:
        if ranks is not None:
            window.gather(ranks)  # the ranks' running sums, into rank 0's checkpoint
        if not main:
            return
        saved = _checkpoint_state(spec, info, model, optimizer, scaler, state, window, per_epoch)
        # What the run ran on; "data" of a checkpoint is the DatasetInfo record already.
        saved |= {"environment": record["environment"], "provenance": record.get("data")}
        sink.on_checkpoint(
            checkpoints.save(
                checkpoint_dir,
                saved,
                is_best=is_best,
                keep_last=recipe.keep_last,
                fence=fence,
                free_margin=free_margin,
            )
        )

    trained = ranks.wrap(model) if ranks is not None else model
    runner: nn.Module = torch.compile(trained) if recipe.compile else trained  # type: ignore[assignment]
    # Rank 0 evaluates alone, so not through DistributedDataParallel (whose forward may
    # wait for the other ranks).
    evaluated: nn.Module = model if ranks is not None else runner
    probe = BlockProbe(model)
    started = time.perf_counter()
    train_seconds, train_images = 0.0, 0
    stopped = False
    evaluations: dict[str, Evaluation] = {}
    evaluated_at = -1
    # Where the run starts (a resumed one: its checkpoint's step, perhaps already the end).
    sink.on_progress(state.step, total)
    while state.step < total and not stopped:
        epoch, start = divmod(state.step, per_epoch)
        for x, y in train_batches.epoch(epoch, start):
            set_lr(optimizer, learning_rate(recipe, state.step, total, warming_up=state.warming_up))
            diagnose = main and (state.step + 1) % diagnostics_every == 0
            with probe.capture(enabled=diagnose):
                loss, errors = train_step(runner, optimizer, scaler, x, y, recipe, amp_dtype)
            window.add(loss, errors, y.shape[0])
            state.step += 1
            step, epochs = state.step, state.step / per_epoch
            if step % recipe.log_every == 0 or step == total:
                if ranks is not None:
                    # Every rank reads the whole batch's error: the warm-up ends on all at once.
                    ranks.total(window.sums)
                mean_loss, error, images, seconds = window.read_and_reset()
                train_images, train_seconds = train_images + images, train_seconds + seconds
                rate = images / max(seconds, 1e-9)
                values = {"train/loss": mean_loss, "train/error": error, "images_per_s": rate}
                sink.on_metrics(step, epochs, {**values, "lr": optimizer.param_groups[0]["lr"]})
                if state.warming_up and warmup_over(recipe, step, error):
                    state.warming_up = False
                    sink.on_event("info", f"warm-up over at step {step} (train error {error:.3f})")
            if diagnose:
                sink.on_metrics(step, epochs, probe.read())
            pause = time.perf_counter()
            if main and (step % eval_every == 0 or step == total):
                evaluations = _evaluate_all(
                    evaluated, eval_sets, info, state, step, epochs, sink, amp_dtype
                )
                evaluated_at = step
            regular = step % checkpoint_every == 0 or step == total
            if regular:
                is_best = state.last_error <= state.best_error
                state.best_error = min(state.best_error, state.last_error)
                save_checkpoint(is_best=is_best)
            window.exclude(time.perf_counter() - pause)
            sink.on_progress(step, total)
            if step >= total or _should_stop(sink, ranks, step, regular):
                stopped = step < total
                if stopped and not regular:
                    # Keep what was trained since the last checkpoint: a handed-back (or
                    # retried) job resumes here. Not the best: only evaluated states are.
                    save_checkpoint(is_best=False)
                break

    # A stopped run is not evaluated again (a hand-back must be quick and its step axis
    # whole): its summary carries its last evaluation.
    if main and evaluated_at != state.step and not stopped:
        evaluations = _evaluate_all(
            evaluated, eval_sets, info, state, state.step, state.step / per_epoch, sink, amp_dtype
        )
    summary = _summary(
        spec, info, state, evaluations, total, time.perf_counter() - started, stopped
    )
    summary["images_per_s"] = train_images / train_seconds if train_seconds else None
    used = augment or Augmentation(pad=0, flip=False)
    summary["augmentation"] = {
        "recipe": used.recipe if augment else "none",
        "pad": used.pad,
        "flip": used.flip,
        "lighting": used.lighting,
    }
    summary["channels_last"] = channels_last
    summary |= record
    if ranks is not None:
        summary["distributed"] = ranks.describe(recipe.batch_size, _backend())
    sink.on_event("info", "stopped on request" if stopped else "finished")
    return summary


def run_record(data: LoadedDataset, device: torch.device) -> dict[str, Any]:
    """What a run ran on, for its summary and its checkpoints: the data's provenance
    (digest, source, classes, split sizes, skipped files) and the environment."""
    facts: dict[str, Any] = {"environment": environment(device)}
    if data.provenance is not None:
        facts["data"] = data.provenance.to_record()
    return facts


def _should_stop(sink: EventSink, ranks: Ranks | None, step: int, checkpointed: bool) -> bool:
    """Whether to stop after `step`: the sink's wish, agreed by all ranks at their stop checks."""
    if ranks is None:
        return sink.should_stop()
    if step % STOP_EVERY and not checkpointed:
        return False
    return ranks.agree(sink.should_stop())


def _ready_rank(ranks: Ranks, window: Window, step: int, seed: int) -> None:
    """Ready a rank for its first step: the window's restored sums are rank 0's alone, and
    random ops (dropout) draw a stream of their own on every other rank."""
    if not ranks.is_main:
        window.sums.zero_()
        torch.manual_seed(seed_of(seed, ranks.rank, step))


def _backend() -> str:
    return str(torch.distributed.get_backend())


def describe_ranks(facts: dict[str, Any]) -> str:
    """One log line for how a run is spread over its processes."""
    return (
        f"{facts['world_size']} processes ({facts['backend']}): global batch "
        f"{facts['global_batch']}, {facts['per_rank_batch']} per rank; "
        f"BatchNorm {facts['batchnorm']}; {facts['lr_rule']}"
    )


def _as_used(
    spec: TrainSpec, info: DatasetInfo, device: torch.device, restored: dict[str, Any] | None
) -> TrainSpec:
    """The spec with its defaults resolved, a resumed run's augmentation kept.

    It is a train spec: a service job's fields of its own (what it needs of a worker) stay
    out of `spec.json` and checkpoints, which are read back as train specs.
    """
    resumed = None if restored is None else TrainSpec.model_validate(restored["spec"]).recipe
    plain = TrainSpec.model_validate(spec.model_dump(include=set(TrainSpec.model_fields)))
    return resolve_defaults(plain, info, device, resumed=resumed)


def _augmentation(spec: TrainSpec, info: DatasetInfo) -> Augmentation | None:
    """The training batches' augmentation (of a spec as used); None when off."""
    recipe = spec.recipe
    if not recipe.augment:
        return None
    return Augmentation(
        augment_pad(recipe, info.image_size),
        augment_flip(recipe, spec.dataset),
        recipe=augmentation_recipe(recipe, spec.dataset, info),
        lighting=recipe.pca_lighting if recipe.augmentation == "imagenet_scale" else 0.0,
    )


def build_model(spec: ModelSpec, info: DatasetInfo) -> models.ResNet:
    """The spec's net, shaped for the data's classes and channels."""
    return models.build(
        spec.name, num_classes=info.num_classes, in_channels=info.channels, **spec.options
    )


def autocast_dtype(recipe: RecipeSpec, device: torch.device) -> torch.dtype | None:
    """bf16 autocast on CUDA unless turned off; the CPU trains in float32 by default."""
    choice = recipe.mixed_precision
    if choice == "auto":
        return torch.bfloat16 if device.type == "cuda" else None
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "off": None}[choice]


def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    x: Tensor,
    y: Tensor,
    recipe: RecipeSpec,
    amp_dtype: torch.dtype | None,
) -> tuple[Tensor, Tensor]:
    """One SGD step; returns the loss and the number of misclassified images (on device)."""
    with torch.autocast(
        x.device.type, dtype=amp_dtype or torch.bfloat16, enabled=amp_dtype is not None
    ):
        logits = model(x)
        loss = F.cross_entropy(logits, y, label_smoothing=recipe.label_smoothing)
    optimizer.zero_grad(set_to_none=True)
    scaler.scale(loss).backward()
    if recipe.grad_clip is not None:
        scaler.unscale_(optimizer)
        nn.utils.clip_grad_norm_(model.parameters(), recipe.grad_clip)
    scaler.step(optimizer)
    scaler.update()
    return loss.detach(), (logits.detach().argmax(1) != y).sum()


def _evaluate_all(
    model: nn.Module,
    eval_sets: dict[str, Batches],
    info: DatasetInfo,
    state: LoopState,
    step: int,
    epochs: float,
    sink: EventSink,
    amp_dtype: torch.dtype | None,
) -> dict[str, Evaluation]:
    """Evaluate on validation and test, report the errors, and track the best."""
    results: dict[str, Evaluation] = {}
    values: dict[str, float] = {}
    for name, batches in eval_sets.items():
        result = results[name] = evaluate(
            model, batches, info.num_classes, autocast_dtype=amp_dtype
        )
        values |= {f"{name}/loss": result.loss, f"{name}/error": result.error}
        values[f"{name}/top5_error"] = result.top5_error
    # The best checkpoint is chosen on validation error, on test error when there is none.
    selector = "val/error" if "val/error" in values else "test/error"
    state.last_error = values.get(selector, math.nan)
    state.best_test_error = min(state.best_test_error, values.get("test/error", math.inf))
    sink.on_metrics(step, epochs, values)
    return results


def _checkpoint_state(
    spec: TrainSpec,
    info: DatasetInfo,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    state: LoopState,
    window: Window,
    per_epoch: int,
) -> dict[str, Any]:
    return {
        "format": 1,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scaler": scaler.state_dict(),
        "step": state.step,
        "epoch": state.step // per_epoch,
        "rng": torch.get_rng_state(),
        "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "spec": spec.model_dump(mode="json"),
        "data": info.to_record(),
        "preprocessing": preprocessing_for(spec.dataset, info).to_record(),
        "loop": {
            "warming_up": state.warming_up,
            "best_error": state.best_error,
            "last_error": state.last_error,
            "best_test_error": state.best_test_error,
            "window": window.sums.tolist(),
        },
    }


def _restore(
    saved: dict[str, Any],
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    state: LoopState,
    window: Window,
) -> None:
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    scaler.load_state_dict(saved["scaler"])
    torch.set_rng_state(saved["rng"])
    if saved["cuda_rng"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(saved["cuda_rng"])
    loop = saved["loop"]
    state.step = saved["step"]
    state.warming_up = loop["warming_up"]
    state.best_error = loop["best_error"]
    state.last_error = loop["last_error"]
    state.best_test_error = loop["best_test_error"]
    window.sums.copy_(torch.tensor(loop["window"], dtype=torch.float64))


def _summary(
    spec: TrainSpec,
    info: DatasetInfo,
    state: LoopState,
    final: dict[str, Evaluation],
    total: int,
    wall_time: float,
    stopped: bool,
) -> dict[str, Any]:
    described = models.describe(
        spec.model.name,
        num_classes=info.num_classes,
        in_channels=info.channels,
        input_size=info.image_size[0],
        **spec.model.options,
    )
    test = final.get("test")
    return {
        "model": spec.model.name,
        "dataset": info.name,
        "steps": state.step,
        "total_steps": total,
        "stopped": stopped,
        "params": described["params"],
        "macs": described["macs"],
        "final_test_error": test.error if test else None,
        "best_test_error": _finite(state.best_test_error),
        "best_error": _finite(state.best_error),
        "wall_time_s": wall_time,
        "final": {name: result.as_dict() for name, result in final.items()},
    }


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None

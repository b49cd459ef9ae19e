"""The training loop: reads top to bottom, reports to an `EventSink`, resumes exactly.

No host synchronisation per step: the running loss and error accumulate on the device and
are read every `log_every` steps. A run resumed from its latest checkpoint continues the
same step axis with the same batches, so N steps in one go equal N/2 + N/2 bit for bit.

A training loss that is not finite ends the run with `TrainingDivergedError` at the next
read (a log, an evaluation or a checkpoint), naming its first such step; nothing trained
after it is saved. A recipe's `early_stop` ends a run whose metric stopped improving (a
plateau): the run succeeds, its summary saying why it `ended`.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
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
from training.options import RunOptions
from training.pipeline import Augmentation, make_batches, seed_of
from training.preprocess import preprocessing_for
from training.ranks import Ranks, SingleRank
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
_ADVICE = "lower recipe.lr or use warm-up (recipe.warmup linear)"
SINGLE_RANK = SingleRank()


class TrainingDivergedError(RuntimeError):
    """The training loss stopped being a finite number: the run cannot recover."""


@dataclass
class Plateau:
    """The best value yet of the metric `recipe.early_stop` watches, and the evaluations
    since it (Keras's and Lightning's `EarlyStopping`)."""

    best: float = math.inf
    best_step: int = 0
    since: int = 0  # evaluations without an improvement

    def observe(self, value: float, step: int, min_delta: float) -> None:
        """Count an evaluation: an improvement is a value more than `min_delta` below the best."""
        if value < self.best - min_delta:
            self.best, self.best_step, self.since = value, step, 0
        else:
            self.since += 1


@dataclass
class LoopState:
    """What the loop carries from step to step, and into a checkpoint."""

    step: int = 0
    warming_up: bool = False
    best_error: float = math.inf  # of the split that selects the best checkpoint
    last_error: float = math.nan
    best_test_error: float = math.inf
    plateau: Plateau = field(default_factory=Plateau)
    train_values: dict[str, float] = field(default_factory=dict)  # the latest train/ means


class Window:
    """Running sums of training loss and errors, kept on the device between reads, and the
    first step whose loss was not finite."""

    def __init__(self, device: torch.device) -> None:
        self.sums = torch.zeros(3, dtype=torch.float64, device=device)
        self.started = time.perf_counter()
        # This rank's first step with a loss that is not finite (inf: none), and that loss.
        self.first_bad = torch.full((), math.inf, dtype=torch.float64, device=device)
        self.bad_loss = torch.zeros((), dtype=torch.float64, device=device)
        self.checked_at = -1  # the step whose losses, and all before, were last found finite

    def add(self, loss: Tensor, errors: Tensor, count: int, step: int) -> None:
        """Add step `step`'s mean loss and misclassified images over `count` images."""
        self.sums[0] += loss.double() * count
        self.sums[1] += errors
        self.sums[2] += count
        candidate = torch.where(torch.isfinite(loss), math.inf, float(step)).double()
        self.bad_loss = torch.where(candidate < self.first_bad, loss.double(), self.bad_loss)
        torch.minimum(self.first_bad, candidate, out=self.first_bad)

    def first_non_finite(self, ranks: Ranks) -> tuple[int, float] | None:
        """The first step of any rank whose loss was not finite, and that loss; None when
        none was (one device sync, and a collective every rank meets)."""
        slots = torch.zeros(ranks.world_size, 2, dtype=torch.float64, device=self.sums.device)
        slots[ranks.rank, 0], slots[ranks.rank, 1] = self.first_bad, self.bad_loss
        ranks.total(slots)  # each rank's pair in its own row, on every rank
        step, loss = min(slots.tolist())
        return None if math.isinf(step) else (int(step), loss)

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
    options: RunOptions,
    sink: EventSink,
    ranks: Ranks = SINGLE_RANK,
) -> dict[str, Any]:
    """Train `spec` on `data`, checkpointing to `out_dir/checkpoints`; return the summary.

    The spec as used, its defaults resolved for the data and the device, goes to
    `out_dir/spec.json` and into every checkpoint. A checkpoint is written only with its
    size plus `free_margin` bytes free on its disk (else `checkpoints.DiskFullError`).
    `ranks` is this process's place in the run (`training.ranks`).
    """
    device = options.train_device
    latest, restored = _resume_point(options, sink, ranks)
    ranks.check(spec.recipe.batch_size, len(data.train))
    # A fine-tune's weights (a fresh run's) and normalisation (the source's).
    spec, info, source = finetune.start(spec, data.info, restored)
    given, spec = spec.recipe, _as_used(spec, info, device, restored)
    _check_early_stop(spec.recipe, data)
    _write_spec(spec, options.out_dir, ranks)
    learner = _build_learner(spec, info, source, device)
    del source  # its weights are the net's now
    record = run_record(data, device)
    if skipped := data.provenance.skipped if data.provenance else ():
        named = ", ".join(file for file, _ in skipped[:5])
        sink.on_event("warning", f"{len(skipped)} unreadable images left out: {named}")
    feed = _make_feed(spec, info, data, device, ranks)
    run = Run(spec, info, learner, feed, Schedule.of(spec.recipe, len(feed.train)), record)
    state = LoopState(warming_up=uses_paper_warmup(spec.recipe, spec.model))
    window = Window(device)
    _begin(run, state, window, latest, restored, given, sink, ranks)

    started = time.perf_counter()
    tally = _train(run, state, window, options, sink, ranks)
    # A stopped run is not evaluated again (a hand-back must be quick and its step axis
    # whole): its summary carries its last evaluation.
    if ranks.is_main and tally.evaluated_at != state.step and not tally.stopped:
        tally.evaluations = _evaluate_all(run, state, state.step, tally.evaluator, sink)
    summary = _summary(run, state, tally, time.perf_counter() - started)
    if (spread := ranks.describe(spec.recipe.batch_size)) is not None:
        summary["distributed"] = spread
    sink.on_event("info", _ending(tally, state.step))
    return summary


def _check_early_stop(recipe: RecipeSpec, data: LoadedDataset) -> None:
    """Refuse an early stop on a metric of a split that the run does not have."""
    stop = recipe.early_stop
    split = stop.metric.split("/")[0] if stop is not None else "train"
    if stop is not None and split != "train" and len(getattr(data, split)) == 0:
        named = "validation" if split == "val" else "test"
        raise ValueError(
            f"recipe.early_stop.metric {stop.metric} is never evaluated: {data.info.name} has "
            f"no {named} images in this run; watch another metric (e.g. test/error)"
        )


def _ending(tally: Tally, step: int) -> str:
    """The run's last log line: how it ended."""
    if tally.plateau is not None:
        return f"stopped early at step {step}: {tally.plateau}"
    return "stopped on request" if tally.stopped else "finished"


@dataclass
class Learner:
    """The net and what steps it: optimizer, gradient scaler, autocast dtype."""

    model: models.ResNet
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    amp_dtype: torch.dtype | None
    channels_last: bool


@dataclass
class Feed:
    """The batches a run trains on, and those it evaluates on (rank 0's alone)."""

    train: Batches
    evaluated: dict[str, Batches]
    augmentation: Augmentation | None


@dataclass(frozen=True)
class Schedule:
    """When a run evaluates, checkpoints and diagnoses, in steps, and how long it is."""

    per_epoch: int
    total: int
    eval_every: int
    checkpoint_every: int
    diagnostics_every: int

    @classmethod
    def of(cls, recipe: RecipeSpec, per_epoch: int) -> Schedule:
        """The recipe's schedule over epochs of `per_epoch` steps (an epoch, by default)."""
        total = total_iterations(recipe, per_epoch)
        return cls(
            per_epoch,
            total,
            eval_every=recipe.eval_every or per_epoch,
            checkpoint_every=recipe.checkpoint_every or per_epoch,
            diagnostics_every=recipe.diagnostics_every or max(1, total // 10),
        )


@dataclass(frozen=True)
class Run:
    """What the loop trains, set up once before its first step."""

    spec: TrainSpec  # as used
    info: DatasetInfo
    learner: Learner
    feed: Feed
    schedule: Schedule
    record: dict[str, Any]  # what the run runs on (`run_record`)


@dataclass
class Tally:
    """What this process's part of a run came to: throughput, evaluations, a stop."""

    evaluator: nn.Module
    train_seconds: float = 0.0
    train_images: int = 0
    evaluations: dict[str, Evaluation] = field(default_factory=dict)
    evaluated_at: int = -1
    stopped: bool = False  # on request (a cancel, a hand-back, a time limit)
    plateau: str | None = None  # why `recipe.early_stop` ended the run, when it did


def _resume_point(
    options: RunOptions, sink: EventSink, ranks: Ranks
) -> tuple[Path | None, dict[str, Any] | None]:
    """The checkpoint the run resumes from, and its contents; (None, None) to start afresh.

    A torn or corrupted newest checkpoint is set aside for the one before (as the worker
    does). Every rank resumes from rank 0's checkpoint, which only rank 0 needs to read.
    """
    latest = None
    if options.resume and ranks.is_main:
        warn = functools.partial(sink.on_event, "warning")
        latest = checkpoints.latest_verified(options.out_dir / checkpoints.DIRECTORY, warn=warn)
    restored = checkpoints.load(latest) if latest is not None else None
    return ranks.share((latest, restored))


def _write_spec(spec: TrainSpec, out_dir: Path, ranks: Ranks) -> None:
    """Write the spec as used to `out_dir/spec.json` (rank 0)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    if ranks.is_main:
        (out_dir / "spec.json").write_text(spec.model_dump_json(indent=2))


def _build_learner(
    spec: TrainSpec, info: DatasetInfo, source: finetune.Source | None, device: torch.device
) -> Learner:
    """The spec's net on `device`, seeded, with a fine-tune's weights, and its optimizer."""
    recipe, channels_last = spec.recipe, bool(spec.recipe.channels_last)
    torch.manual_seed(recipe.seed)
    model = build_model(spec.model, info)
    finetune.prepare(model, spec.init, source)
    model = model.to(device)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    amp_dtype = autocast_dtype(recipe, device)
    # Fixed shapes every step: let cuDNN pick its fastest kernels once.
    torch.backends.cudnn.benchmark = device.type == "cuda"
    scaler = torch.amp.GradScaler(device.type, enabled=amp_dtype == torch.float16)
    optimizer = make_optimizer(recipe, model, finetune.param_groups(model, spec.init))
    return Learner(model, optimizer, scaler, amp_dtype, channels_last)


def _make_feed(
    spec: TrainSpec, info: DatasetInfo, data: LoadedDataset, device: torch.device, ranks: Ranks
) -> Feed:
    """The training batches (this rank's part of each), and rank 0's evaluation batches."""
    recipe, augmentation = spec.recipe, _augmentation(spec, info)
    batches = functools.partial(
        make_batches,
        info=info,
        device=device,
        seed=recipe.seed,
        channels_last=bool(recipe.channels_last),
        preprocessing=preprocessing_for(spec.dataset, info),
    )
    train_batches = batches(
        data.train,
        batch_size=recipe.batch_size,
        augment=augmentation,
        shuffle=True,
        drop_last=len(data.train) > recipe.batch_size,
        shard=ranks.shard,
    )
    evaluated = {
        name: batches(split, batch_size=EVAL_BATCH, augment=False, shuffle=False, drop_last=False)
        for name, split in (("val", data.val), ("test", data.test))
        if len(split) > 0 and ranks.is_main
    }
    return Feed(train_batches, evaluated, augmentation)


def _begin(
    run: Run,
    state: LoopState,
    window: Window,
    latest: Path | None,
    restored: dict[str, Any] | None,
    given: RecipeSpec,
    sink: EventSink,
    ranks: Ranks,
) -> None:
    """Restore a resumed run's state (or announce a fresh one) and ready this rank."""
    spec, learner = run.spec, run.learner
    if latest is not None and restored is not None:
        _restore(restored, learner, state, window)
        sink.on_event("info", f"resumed from {latest.name} at step {state.step}")
    else:
        total = run.schedule.total
        sink.on_event("info", f"training {spec.model.name} on {run.info.name} for {total} steps")
        if spec.init is not None:
            sink.on_event("info", finetune.describe(spec.init, run.info))
    sink.on_event("info", describe_augmentation(given, spec))
    sink.on_event("info", f"memory format: {'channels_last' if learner.channels_last else 'NCHW'}")
    if not ranks.is_main:
        # The window's restored sums are rank 0's alone, and random ops (dropout) draw a
        # stream of their own on every other rank.
        window.sums.zero_()
        torch.manual_seed(seed_of(spec.recipe.seed, ranks.rank, state.step))
    if (spread := ranks.describe(spec.recipe.batch_size)) is not None:
        sink.on_event("info", describe_ranks(spread))


def _train(
    run: Run, state: LoopState, window: Window, options: RunOptions, sink: EventSink, ranks: Ranks
) -> Tally:
    """Train from `state.step` to the end of the schedule, or until asked to stop."""
    model, schedule = run.learner.model, run.schedule
    trained = ranks.wrap(model)
    runner: nn.Module = torch.compile(trained) if run.spec.recipe.compile else trained  # type: ignore[assignment]
    # Rank 0 evaluates alone, so not through DistributedDataParallel (whose forward may
    # wait for the other ranks).
    tally = Tally(evaluator=model if trained is not model else runner)
    probe = BlockProbe(model)
    fence = sink.fence  # a service sink's (its checkpoints are fenced)
    save = functools.partial(_save, run, state, window, options, fence, sink, ranks)
    # Where the run starts (a resumed one: its checkpoint's step, perhaps already the end).
    sink.on_progress(state.step, schedule.total)
    # A run resumed from the checkpoint its plateau ended it at ends there again.
    tally.plateau = _plateau_reached(run.spec.recipe, state.plateau)
    while state.step < schedule.total and not tally.stopped and tally.plateau is None:
        epoch, start = divmod(state.step, schedule.per_epoch)
        for x, y in run.feed.train.epoch(epoch, start):
            _step(run, state, window, tally, runner, probe, x, y, sink, ranks)
            if _after_step(run, state, window, tally, save, sink, ranks):
                break
    return tally


def _step(
    run: Run,
    state: LoopState,
    window: Window,
    tally: Tally,
    runner: nn.Module,
    probe: BlockProbe,
    x: Tensor,
    y: Tensor,
    sink: EventSink,
    ranks: Ranks,
) -> None:
    """One training step, with its metrics every `log_every` steps and its diagnostics."""
    recipe, learner, schedule = run.spec.recipe, run.learner, run.schedule
    lr = learning_rate(recipe, state.step, schedule.total, warming_up=state.warming_up)
    set_lr(learner.optimizer, lr)
    diagnose = ranks.is_main and (state.step + 1) % schedule.diagnostics_every == 0
    with probe.capture(enabled=diagnose):
        loss, errors = train_step(
            runner, learner.optimizer, learner.scaler, x, y, recipe, learner.amp_dtype
        )
    state.step += 1
    window.add(loss, errors, y.shape[0], state.step)
    step, epochs = state.step, state.step / schedule.per_epoch
    if step % recipe.log_every == 0 or step == schedule.total:
        _check_finite(run, state, window, ranks)
        # Every rank reads the whole batch's error: the warm-up ends on all at once.
        ranks.total(window.sums)
        mean_loss, error, images, seconds = window.read_and_reset()
        tally.train_images += images
        tally.train_seconds += seconds
        rate = images / max(seconds, 1e-9)
        state.train_values = {"train/loss": mean_loss, "train/error": error}
        values = {**state.train_values, "images_per_s": rate}
        sink.on_metrics(step, epochs, {**values, "lr": learner.optimizer.param_groups[0]["lr"]})
        if state.warming_up and warmup_over(recipe, step, error):
            state.warming_up = False
            sink.on_event("info", f"warm-up over at step {step} (train error {error:.3f})")
    if diagnose:
        sink.on_metrics(step, epochs, probe.read())


def _after_step(
    run: Run,
    state: LoopState,
    window: Window,
    tally: Tally,
    save: Callable[..., None],
    sink: EventSink,
    ranks: Ranks,
) -> bool:
    """Evaluate and checkpoint when due, report progress; whether the run ends here.

    The run ends at the end of its budget, on request (rank 0's sink), or on a plateau of
    the metric `recipe.early_stop` watches (rank 0's evaluations): the ranks agree on rank
    0's decision at every checkpoint, and at every evaluation of a run with an early stop.
    """
    step, schedule = state.step, run.schedule
    pause = time.perf_counter()
    evaluated = step % schedule.eval_every == 0 or step == schedule.total
    if evaluated:
        _check_finite(run, state, window, ranks)  # nothing diverged is evaluated
        _check_weights(run, state, ranks)
    if ranks.is_main and evaluated:
        tally.evaluations = _evaluate_all(run, state, step, tally.evaluator, sink)
        tally.evaluated_at = step
        tally.plateau = _track_plateau(run, state, _values(tally.evaluations), step)
    regular = step % schedule.checkpoint_every == 0 or step == schedule.total
    if regular:
        save(is_best=_new_best(state))
    window.exclude(time.perf_counter() - pause)
    sink.on_progress(step, schedule.total)

    def wish() -> bool:
        return tally.plateau is not None or sink.should_stop()

    # With an early stop, the ranks agree at every evaluation: a plateau ends them there.
    agree = regular or (evaluated and run.spec.recipe.early_stop is not None)
    if step >= schedule.total or ranks.should_stop(wish, step, agree):
        tally.stopped = step < schedule.total and tally.plateau is None
        if step < schedule.total and not regular:
            # Keep what was trained since the last checkpoint: a handed-back (or retried)
            # job resumes here. Not the best unless just evaluated (a plateau's end).
            save(is_best=tally.plateau is not None and _new_best(state))
        return True
    return False


def _new_best(state: LoopState) -> bool:
    """Whether the latest evaluation is the best yet (recorded as such), for a checkpoint."""
    is_best = state.last_error <= state.best_error
    state.best_error = min(state.best_error, state.last_error)
    return is_best


def _check_finite(run: Run, state: LoopState, window: Window, ranks: Ranks) -> None:
    """Raise `TrainingDivergedError` on every rank at once if the training loss of a step
    of any rank was not finite, naming the first such step (every rank checks at the same
    steps). Only the loss counts: fp16's gradient scaler skips overflowing steps itself."""
    if window.checked_at == state.step:
        return
    found = window.first_non_finite(ranks)
    if found is None:
        window.checked_at = state.step
        return
    step, loss = found
    lr = _lr_at(run, state, step)
    raise TrainingDivergedError(f"the training loss was {loss} at step {step} (lr {lr}); {_ADVICE}")


def _check_weights(run: Run, state: LoopState, ranks: Ranks) -> None:
    """Raise `TrainingDivergedError` on every rank at once if a rank's weights or batch-norm
    statistics are not all finite (the update of a step whose loss was finite can overflow)."""
    model = run.learner.model
    held = [*model.parameters(), *(b for b in model.buffers() if b.is_floating_point())]
    bad = torch.stack([~t.isfinite().all() for t in held]).sum().double().reshape(1)
    if ranks.total(bad).item():
        lr = _lr_at(run, state, state.step)
        raise TrainingDivergedError(
            f"the weights were not finite after step {state.step} (lr {lr}); {_ADVICE}"
        )


def _lr_at(run: Run, state: LoopState, step: int) -> float:
    """The recipe's learning rate of step `step` (counted from 1) since the last check
    (the warm-up only ends at a check that found every loss finite)."""
    return learning_rate(run.spec.recipe, step - 1, run.schedule.total, warming_up=state.warming_up)


def _track_plateau(
    run: Run, state: LoopState, evaluated: dict[str, float], step: int
) -> str | None:
    """Count an evaluation of the early stop's metric (rank 0); why the run ends, if it does."""
    recipe, values = run.spec.recipe, {**state.train_values, **evaluated}
    stop = recipe.early_stop
    if stop is None or step >= run.schedule.total:
        return None
    state.plateau.observe(values.get(stop.metric, math.nan), step, stop.min_delta)
    return _plateau_reached(recipe, state.plateau)


def _plateau_reached(recipe: RecipeSpec, plateau: Plateau) -> str | None:
    """Why the run ends on a plateau of its early stop's metric; None while it goes on."""
    stop = recipe.early_stop
    if stop is None or plateau.since < stop.patience:
        return None
    return (
        f"{stop.metric} did not improve by more than {stop.min_delta} in {plateau.since} "
        f"evaluations (best {plateau.best:.4g} at step {plateau.best_step})"
    )


def _save(
    run: Run,
    state: LoopState,
    window: Window,
    options: RunOptions,
    fence: checkpoints.Fence | None,
    sink: EventSink,
    ranks: Ranks,
    *,
    is_best: bool,
) -> None:
    """Write a checkpoint of the run (rank 0), the ranks' running sums gathered into it;
    never one of a run whose loss or weights went non-finite (`TrainingDivergedError`)."""
    _check_finite(run, state, window, ranks)
    _check_weights(run, state, ranks)
    window.gather(ranks)
    if not ranks.is_main:
        return
    saved = _checkpoint_state(run, state, window)
    sink.on_checkpoint(
        checkpoints.save(
            options.out_dir / checkpoints.DIRECTORY,
            saved,
            is_best=is_best,
            keep_last=run.spec.recipe.keep_last,
            fence=fence,
            free_margin=options.free_margin,
        )
    )


def run_record(data: LoadedDataset, device: torch.device) -> dict[str, Any]:
    """What a run ran on, for its summary and its checkpoints: the data's provenance
    (digest, source, classes, split sizes, skipped files) and the environment."""
    facts: dict[str, Any] = {"environment": environment(device)}
    if data.provenance is not None:
        facts["data"] = data.provenance.to_record()
    return facts


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
    run: Run, state: LoopState, step: int, model: nn.Module, sink: EventSink
) -> dict[str, Evaluation]:
    """Evaluate on validation and test, report the errors, and track the best."""
    results = {
        name: evaluate(model, batches, run.info.num_classes, autocast_dtype=run.learner.amp_dtype)
        for name, batches in run.feed.evaluated.items()
    }
    values = _values(results)
    # The best checkpoint is chosen on validation error, on test error when there is none.
    selector = "val/error" if "val/error" in values else "test/error"
    state.last_error = values.get(selector, math.nan)
    state.best_test_error = min(state.best_test_error, values.get("test/error", math.inf))
    sink.on_metrics(step, step / run.schedule.per_epoch, values)
    return results


def _values(results: dict[str, Evaluation]) -> dict[str, float]:
    """The metrics of evaluations by split: `val/loss`, `val/error`, `val/top5_error`, ..."""
    values: dict[str, float] = {}
    for name, result in results.items():
        values |= {f"{name}/loss": result.loss, f"{name}/error": result.error}
        values[f"{name}/top5_error"] = result.top5_error
    return values


def _checkpoint_state(run: Run, state: LoopState, window: Window) -> dict[str, Any]:
    """Everything a run resumes from, and what it ran on."""
    spec, info, learner = run.spec, run.info, run.learner
    return {
        "format": 1,
        "model": learner.model.state_dict(),
        "optimizer": learner.optimizer.state_dict(),
        "scaler": learner.scaler.state_dict(),
        "step": state.step,
        "epoch": state.step // run.schedule.per_epoch,
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
            "plateau": asdict(state.plateau),
            "train_values": state.train_values,
        },
        # What the run ran on; "data" of a checkpoint is the DatasetInfo record already.
        "environment": run.record["environment"],
        "provenance": run.record.get("data"),
    }


def _restore(saved: dict[str, Any], learner: Learner, state: LoopState, window: Window) -> None:
    learner.model.load_state_dict(saved["model"])
    learner.optimizer.load_state_dict(saved["optimizer"])
    learner.scaler.load_state_dict(saved["scaler"])
    torch.set_rng_state(saved["rng"])
    if saved["cuda_rng"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(saved["cuda_rng"])
    loop = saved["loop"]
    state.step = saved["step"]
    state.warming_up = loop["warming_up"]
    state.best_error = loop["best_error"]
    state.last_error = loop["last_error"]
    state.best_test_error = loop["best_test_error"]
    # Checkpoints written before early stops and plateaus have neither.
    state.plateau = Plateau(**loop.get("plateau", {}))
    state.train_values = dict(loop.get("train_values", {}))
    window.sums.copy_(torch.tensor(loop["window"], dtype=torch.float64))


def _summary(run: Run, state: LoopState, tally: Tally, wall_time: float) -> dict[str, Any]:
    """The run's summary: what it trained, its errors, its throughput and what it ran on."""
    spec, info = run.spec, run.info
    described = models.describe(
        spec.model.name,
        num_classes=info.num_classes,
        in_channels=info.channels,
        input_size=info.image_size[0],
        **spec.model.options,
    )
    test = tally.evaluations.get("test")
    augmentation = run.feed.augmentation
    used = augmentation or Augmentation(pad=0, flip=False)
    return {
        "model": spec.model.name,
        "dataset": info.name,
        "steps": state.step,
        "total_steps": run.schedule.total,
        "stopped": tally.stopped,
        "ended": _ended(tally, state.step),
        "params": described["params"],
        "macs": described["macs"],
        "final_test_error": test.error if test else None,
        "best_test_error": _finite(state.best_test_error),
        "best_error": _finite(state.best_error),
        "wall_time_s": wall_time,
        "final": {name: result.as_dict() for name, result in tally.evaluations.items()},
        "images_per_s": (tally.train_images / tally.train_seconds if tally.train_seconds else None),
        "augmentation": {
            "recipe": used.recipe if augmentation else "none",
            "pad": used.pad,
            "flip": used.flip,
            "lighting": used.lighting,
        },
        "channels_last": run.learner.channels_last,
        **run.record,
    }


def _ended(tally: Tally, step: int) -> dict[str, Any]:
    """Why the run ended: its budget done (finished), on request (stopped), or a plateau."""
    if tally.plateau is not None:
        return {"reason": "plateau", "message": tally.plateau, "step": step}
    return {"reason": "stopped" if tally.stopped else "finished"}


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None

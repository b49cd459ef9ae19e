"""The rules that end a run before its budget: a diverged loss fails it, naming the first
non-finite step; a plateau of the metric `recipe.early_stop` watches ends it as a success."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from pydantic import ValidationError
from torch import Tensor

from tests.helpers import tiny_synthetic
from training import checkpoints, loop, runs
from training.datasets import load_dataset
from training.events import RecordingSink
from training.loop import SINGLE_RANK, TrainingDivergedError, Window, fit, train_step
from training.options import RunOptions
from training.specs import RecipeSpec, TrainSpec

# fp16 at lr 10 without warm-up overflows the logits within a few dozen steps.
BUDGET = 400
DIVERGING: dict[str, Any] = {"lr": 10, "warmup": "off", "mixed_precision": "fp16"}
ADVICE = "; lower recipe.lr or use warm-up (recipe.warmup linear)"
# No error falls by more than 1.0: every evaluation after the first is a plateau's.
NEVER_BETTER = {"metric": "val/error", "patience": 2, "min_delta": 1.0}


def _spec(dataset: dict[str, Any] | None = None, **recipe: Any) -> TrainSpec:
    """The tiny synthetic run, a checkpoint every 4 iterations."""
    fields = {"checkpoint_every": 4} | recipe
    return TrainSpec.model_validate(tiny_synthetic(dataset=dataset, **fields))


def _fit(spec: TrainSpec, out: Path, sink: RecordingSink | None = None) -> dict[str, Any]:
    data = load_dataset(spec.dataset, data_root=out)
    return fit(spec, data, RunOptions(out_dir=out), sink or RecordingSink())


def _recording_losses(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Every training step's loss, read on the host (a reference, for tests only)."""
    losses: list[float] = []

    def recorded(*args: Any, **kwargs: Any) -> tuple[Tensor, Tensor]:
        loss, errors = train_step(*args, **kwargs)
        losses.append(loss.item())
        return loss, errors

    monkeypatch.setattr(loop, "train_step", recorded)
    return losses


def test_a_diverged_run_fails_naming_its_first_non_finite_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    losses = _recording_losses(monkeypatch)
    spec = _spec(**DIVERGING, iterations=BUDGET, checkpoint_every=5, eval_every=5)
    sink = RecordingSink()
    with pytest.raises(TrainingDivergedError) as raised:
        _fit(spec, tmp_path, sink)

    message = str(raised.value)
    bad = [step for step, loss in enumerate(losses, 1) if not math.isfinite(loss)]
    if bad:
        first, loss = bad[0], losses[bad[0] - 1]
        assert message == f"the training loss was {loss} at step {first} (lr 10.0){ADVICE}"
        # Found at the next read (a checkpoint here), long before the end of the budget.
        assert len(losses) < first + 5 < BUDGET
    else:
        # The update of a checkpoint's step overflowed the weights: their check found it.
        first = len(losses) + 1
        assert message == f"the weights were not finite after step {len(losses)} (lr 10.0){ADVICE}"
        assert len(losses) % 5 == 0
    # What was saved before stays, and nothing of the diverged steps is saved.
    folder = tmp_path / checkpoints.DIRECTORY
    steps = sorted(checkpoints.load(path)["step"] for path in folder.glob("step-*.pt"))
    assert steps
    assert max(steps) < first, steps
    for path in [*folder.glob("step-*.pt"), folder / checkpoints.BEST]:
        weights = checkpoints.load(path)["model"]
        assert all(torch.isfinite(v).all() for v in weights.values() if v.is_floating_point())
    assert not [v for _, v in sink.series("train/loss") if not math.isfinite(v)]


def test_the_gradient_scalers_skipped_steps_are_no_divergence() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    # Scaled by 2^127 the gradients overflow: the scaler skips the step and backs off.
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**127)
    before = [p.detach().clone() for p in model.parameters()]
    x, y = torch.randn(4, 3, 2, 2), torch.tensor([0, 1, 2, 0])
    loss, _ = train_step(model, optimizer, scaler, x, y, RecipeSpec(), torch.float16)
    assert scaler.get_scale() < 2.0**127
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))

    window = Window(torch.device("cpu"))
    window.add(loss, torch.tensor(0), 4, step=1)
    assert window.first_non_finite(SINGLE_RANK) is None
    window.add(torch.tensor(math.inf), torch.tensor(0), 4, step=2)
    window.add(torch.tensor(math.nan), torch.tensor(0), 4, step=3)
    assert window.first_non_finite(SINGLE_RANK) == (2, math.inf)


def test_a_plateau_ends_the_run_early_as_a_success(tmp_path: Path) -> None:
    sink = RecordingSink()
    summary = _fit(_spec(early_stop=NEVER_BETTER), tmp_path, sink)

    # Evaluations at 4 (the best), 8 and 12 (two without an improvement).
    best = dict(sink.series("val/error"))[4]
    message = (
        f"val/error did not improve by more than 1.0 in 2 evaluations (best {best:.4g} at step 4)"
    )
    assert summary["ended"] == {"reason": "plateau", "message": message, "step": 12}
    assert (summary["steps"], summary["total_steps"], summary["stopped"]) == (12, 40, False)
    assert sink.events[-1] == ("info", f"stopped early at step 12: {message}")
    assert (tmp_path / checkpoints.DIRECTORY / "step-12.pt").is_file()

    # Resumed at its plateau (its worker died before the outcome): it ends there again.
    again = RecordingSink()
    assert _fit(_spec(early_stop=NEVER_BETTER), tmp_path, again)["ended"]["reason"] == "plateau"
    assert again.step == 12
    assert not again.series("train/loss")


def test_runs_without_an_early_stop_say_they_finished_or_were_stopped(tmp_path: Path) -> None:
    assert _fit(_spec(iterations=8), tmp_path / "whole")["ended"] == {"reason": "finished"}
    stopped = _fit(_spec(iterations=8), tmp_path / "stopped", RecordingSink(stop_at=4))
    assert (stopped["stopped"], stopped["ended"]) == (True, {"reason": "stopped"})
    # A run whose last evaluation would be a plateau's has finished its budget all the same.
    at_end = _fit(_spec(iterations=12, early_stop=NEVER_BETTER), tmp_path / "at_end")
    assert at_end["ended"] == {"reason": "finished"}


def test_a_resumed_run_keeps_its_plateau_count(tmp_path: Path) -> None:
    spec = _spec(early_stop=NEVER_BETTER)
    whole = _fit(spec, tmp_path / "whole")
    # Stopped after the evaluations at 4 (best) and 8 (one without an improvement).
    first = _fit(spec, tmp_path / "split", RecordingSink(stop_at=8))
    assert first["ended"] == {"reason": "stopped"}
    resumed = _fit(spec, tmp_path / "split")
    assert resumed["ended"] == whole["ended"]
    assert resumed["steps"] == 12


def test_a_checkpoint_without_a_plateau_count_resumes_from_none(tmp_path: Path) -> None:
    spec = _spec(early_stop=NEVER_BETTER)
    _fit(spec, tmp_path, RecordingSink(stop_at=8))
    folder = tmp_path / checkpoints.DIRECTORY
    saved = checkpoints.load(folder / "step-8.pt")
    for path in folder.iterdir():
        path.unlink()
    del saved["loop"]["plateau"], saved["loop"]["train_values"]  # as written before them
    checkpoints.save(folder, saved, is_best=False, keep_last=2)
    # Counting anew from the evaluation at 12 (the best), it ends after those at 16 and 20.
    summary = _fit(spec, tmp_path)
    assert (summary["ended"]["reason"], summary["steps"]) == ("plateau", 20)


def test_a_plateau_of_the_training_loss_is_the_logged_mean(tmp_path: Path) -> None:
    stop = {"metric": "train/loss", "patience": 1, "min_delta": 100.0}
    sink = RecordingSink()
    summary = _fit(_spec(log_every=4, early_stop=stop), tmp_path, sink)
    best = dict(sink.series("train/loss"))[4]
    assert summary["ended"]["message"] == (
        f"train/loss did not improve by more than 100.0 in 1 evaluations (best {best:.4g} at "
        "step 4)"
    )
    assert summary["steps"] == 8


def test_an_early_stop_on_a_split_the_run_lacks_is_refused() -> None:
    with pytest.raises(ValidationError) as refused:
        _spec({"validation": 0}, early_stop={"metric": "val/loss"})
    assert (
        "recipe.early_stop.metric val/loss is never evaluated: with dataset.validation 0 the "
        "run has no validation split; hold one out (e.g. dataset.validation 0.1) or watch "
        "test/error"
    ) in str(refused.value)
    for bad in ({"patience": 0}, {"metric": "lr"}, {"min_delta": -1}, {"min_delta": "inf"}):
        with pytest.raises(ValidationError):
            _spec(early_stop=bad)
    assert _spec({"validation": 0}, early_stop={"metric": "test/error"}).recipe.early_stop


def test_an_early_stop_on_a_split_found_empty_fails_at_the_start(tmp_path: Path) -> None:
    # 0.5% of 64 images rounds to no validation image at all.
    spec = _spec({"validation": 0.005}, early_stop={"metric": "val/error"})
    with pytest.raises(ValueError, match="val/error is never evaluated: synthetic has no "):
        runs.train(spec, RunOptions(out_dir=tmp_path, data_root=tmp_path), RecordingSink())
    assert not (tmp_path / checkpoints.DIRECTORY).exists()


def test_two_ranks_fail_together_on_a_divergence_and_agree_on_a_plateau(tmp_path: Path) -> None:
    options = RunOptions(out_dir=tmp_path / "diverged", data_root=tmp_path)
    diverging = _spec(**DIVERGING, iterations=BUDGET, checkpoint_every=5, eval_every=5)
    with pytest.raises(TrainingDivergedError, match=r"not finite after step \d+|at step \d+"):
        runs.train(diverging, options, RecordingSink(), nproc=2)

    options = RunOptions(out_dir=tmp_path / "plateau", data_root=tmp_path)
    summary = runs.train(_spec(early_stop=NEVER_BETTER), options, RecordingSink(), nproc=2)
    assert (summary["ended"]["reason"], summary["ended"]["step"], summary["steps"]) == (
        "plateau",
        12,
        12,
    )

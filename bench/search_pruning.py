"""Search pruning: one random search of learning rate x weight decay, with a pruner and
without, on the same sampled trials.

The random sampler draws the same configurations whatever the trials' results, so the two
searches train the same trials; one lets its pruner (ASHA by default) stop the losers at
their evaluations, the other runs every trial to its end. Prints, as a Markdown table, the
job-seconds each spent, the trials pruned, each search's best trial, and where the pruned
search's best stands among the trials run to the end (its final objective there, its rank,
its distance to the true best against the spread of the top trials). Runs every job in
this process on a SQLite database of its own; the defaults take about 40 s of a quiet
2-core CPU (about 20 minutes of one loaded with a training study).

    .venv/bin/python -u -m bench.search_pruning --dataset digits --trials 12 \
        --shot docs/studies/search-asha-digits.png
    .venv/bin/python -u -m bench.search_pruning --pruner median   # or hyperband
    .venv/bin/python -u -m bench.search_pruning --method tpe --pruned-only

With `--method tpe` the two searches sample by their own results, so their trials differ.

`--shot` then serves the dashboard on the pruned search's database and saves its study
page's search part (best trial, best so far, parallel coordinates, importances) as a PNG,
through headless Chromium (`/usr/bin/chromium`, as the dashboard's tests use it);
`--pruned-only` stops there, without the search run to the end, and prints the pruned
search's spend and best trial.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from sqlalchemy import select

from cli.server import embedded_places, open_embedded
from core.db.session import get_engine, session_scope
from core.db.tables import Job, Metric, Study
from core.settings import Settings, get_settings
from core.studies import search, service
from worker.runner import execute

SPACE = {
    "recipe.lr": {"type": "loguniform", "low": 0.003, "high": 1.0},
    "recipe.weight_decay": {"type": "loguniform", "low": 1e-6, "high": 1e-2},
}


def run_search(
    root: Path, base: dict[str, Any], trials: int, pruner: str, seed: int, method: str = "random"
) -> dict[str, Any]:
    """Run a search to its end, one trial at a time; its trials' outcomes."""
    places: dict[str, Any] = embedded_places(root, "study.db")
    settings = Settings(**places, data_dir=get_settings().data_dir, device="cpu")
    open_embedded(root, settings)
    found = search.Search(method=method, space=SPACE, trials=trials, pruner=pruner, seed=seed)  # type: ignore[arg-type]
    request = service.Request(base=base, grid={}, seeds=[0], max_parallel=1, search=found)
    with session_scope(settings.database_url) as session:
        study = service.create(
            session=session,
            settings=settings,
            request=request,
            max_jobs=settings.max_study_jobs,
            max_attempts=1,
        )
        study_id = study.id
        waiting = service.release(session=session, settings=settings, study_id=study_id)
    started = time.perf_counter()
    while waiting:
        execute(waiting[0], settings=settings, worker="bench")  # it asks for the next trial
        with session_scope(settings.database_url) as session:
            queued = select(Job.id).where(Job.study_id == study_id, Job.status == "queued")
            waiting = list(session.scalars(queued.order_by(Job.cell)))
    wall = time.perf_counter() - started
    outcome = _trials(settings, study_id)
    get_engine(settings.database_url).dispose()
    return {"wall_s": wall, "trials": outcome, "study": study_id, "database": settings.database_url}


def shoot(database_url: str, study_id: uuid.UUID, png: Path) -> None:
    """Save the dashboard's view of a search study (its search part) as `png`."""
    from playwright.sync_api import sync_playwright

    from bench.api_load import api_server

    broker = database_url.replace("study.db", "broker.db").replace("sqlite", "sqla+sqlite", 1)
    with api_server(database_url, broker) as base, sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(f"{base.removesuffix('/api/v1')}/#/studies/{study_id}")
        page.wait_for_selector("#parallel-coordinates polyline")
        page.wait_for_timeout(1500)  # plotly's charts settle
        png.parent.mkdir(parents=True, exist_ok=True)
        page.locator("#study-search").screenshot(path=str(png))
        browser.close()


def _trials(settings: Settings, study_id: uuid.UUID) -> list[dict[str, Any]]:
    """Each trial: its values, status, job-seconds and last val/error."""
    with session_scope(settings.database_url) as session:
        study = session.get(Study, study_id)
        assert study is not None
        rows = []
        for job in session.scalars(select(Job).where(Job.study_id == study_id).order_by(Job.cell)):
            last = session.scalar(
                select(Metric.value)
                .where(Metric.job_id == job.id, Metric.name == "val/error")
                .order_by(Metric.step.desc())
                .limit(1)
            )
            seconds = (
                (job.finished_at - job.started_at).total_seconds()
                if job.started_at and job.finished_at
                else 0.0
            )
            rows.append(
                {
                    "trial": job.cell,
                    "values": study.cells[job.cell or 0]["values"],
                    "status": job.status,
                    "steps": job.step,
                    "job_s": seconds,
                    "objective": last,
                }
            )
        return rows


def report(pruned: dict[str, Any], full: dict[str, Any], pruner: str) -> str:
    """The comparison as Markdown."""
    done = [t for t in full["trials"] if t["objective"] is not None]
    ranked = sorted(done, key=lambda t: t["objective"])
    kept = [
        t for t in pruned["trials"] if t["status"] == "succeeded" and t["objective"] is not None
    ]
    best_pruned = min(kept, key=lambda t: t["objective"])
    truth = {t["trial"]: t for t in full["trials"]}[best_pruned["trial"]]
    rank = 1 + [t["trial"] for t in ranked].index(best_pruned["trial"])
    top = [t["objective"] for t in ranked[:3]]
    spread = statistics.stdev(top) if len(top) > 1 else 0.0
    same_values = [t["values"] for t in pruned["trials"]] == [t["values"] for t in full["trials"]]
    seconds = (sum(t["job_s"] for t in pruned["trials"]), sum(t["job_s"] for t in full["trials"]))
    steps = (
        sum(t["steps"] or 0 for t in pruned["trials"]),
        sum(t["steps"] or 0 for t in full["trials"]),
    )
    lines = [
        f"| | {pruner} | none (every trial to its end) |",
        "|---|---:|---:|",
        f"| trials | {len(pruned['trials'])} | {len(full['trials'])} |",
        f"| pruned | {sum(t['status'] == 'pruned' for t in pruned['trials'])} | 0 |",
        f"| job-seconds | {seconds[0]:.0f} | {seconds[1]:.0f} |",
        f"| steps trained | {steps[0]} | {steps[1]} |",
        f"| wall seconds | {pruned['wall_s']:.0f} | {full['wall_s']:.0f} |",
        f"| best trial | {best_pruned['trial']} ({_values(best_pruned)}) | "
        f"{ranked[0]['trial']} ({_values(ranked[0])}) |",
        f"| best val/error | {100 * best_pruned['objective']:.2f}% | "
        f"{100 * ranked[0]['objective']:.2f}% |",
        "",
        f"Compute saved: {1 - seconds[0] / seconds[1]:.0%} of the job-seconds "
        f"({1 - steps[0] / steps[1]:.0%} of the steps). Same trials sampled: {same_values}.",
        f"The pruned search's best, trial {best_pruned['trial']}, run to its end without a "
        f"pruner ends at {100 * truth['objective']:.2f}% val/error, rank {rank} of "
        f"{len(ranked)}; {100 * (truth['objective'] - ranked[0]['objective']):.2f} points "
        f"from the best, against a standard deviation of {100 * spread:.2f} points over the "
        "top three trials.",
        "",
        "| trial | lr | weight decay | pruned search | val/error | to the end: val/error |",
        "|---:|---:|---:|---|---:|---:|",
    ]
    for mine, theirs in zip(pruned["trials"], full["trials"], strict=True):
        lines.append(
            f"| {mine['trial']} | {mine['values']['recipe.lr']:.4g} | "
            f"{mine['values']['recipe.weight_decay']:.2g} | {mine['status']} at {mine['steps']} | "
            f"{_percent(mine['objective'])} | {_percent(theirs['objective'])} |"
        )
    return "\n".join(lines)


def summary(found: dict[str, Any], pruner: str) -> str:
    """One search alone: what it spent and the best it found."""
    trials = found["trials"]
    done = [t for t in trials if t["status"] == "succeeded" and t["objective"] is not None]
    best = min(done, key=lambda t: t["objective"])
    return (
        f"{pruner}: {sum(t['status'] == 'pruned' for t in trials)} of {len(trials)} pruned, "
        f"{sum(t['job_s'] for t in trials):.0f} job-seconds, "
        f"{sum(t['steps'] or 0 for t in trials)} steps; best trial {best['trial']} "
        f"({_values(best)}) at {_percent(best['objective'])} val/error"
    )


def _values(trial: dict[str, Any]) -> str:
    values = trial["values"]
    return f"lr {values['recipe.lr']:.3g}, wd {values['recipe.weight_decay']:.2g}"


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.2f}%"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="digits")
    parser.add_argument("--model", default="resnet8")
    parser.add_argument("--trials", type=int, default=12)
    parser.add_argument("--iterations", type=int, default=240)
    parser.add_argument("--eval-every", type=int, default=30)
    parser.add_argument("--train-limit", type=int, default=None)
    parser.add_argument("--pruner", default="asha", choices=["median", "asha", "hyperband"])
    parser.add_argument("--method", default="random", choices=["random", "tpe"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--shot", type=Path, help="Save the pruned search's page here (PNG).")
    parser.add_argument(
        "--pruned-only", action="store_true", help="Run the pruned search alone (with --shot)."
    )
    args = parser.parse_args()
    base = {
        "model": {"name": args.model},
        "dataset": {"name": args.dataset, "train_limit": args.train_limit},
        "recipe": {
            "iterations": args.iterations,
            "eval_every": args.eval_every,
            "batch_size": 64,
            "log_every": args.eval_every,
        },
    }
    with tempfile.TemporaryDirectory() as folder:
        pruned = run_search(
            Path(folder) / "pruned", base, args.trials, args.pruner, args.seed, args.method
        )
        if args.shot:
            shoot(pruned["database"], pruned["study"], args.shot)
            print(f"{args.shot}: the pruned search's page", flush=True)
        if args.pruned_only:
            print(summary(pruned, args.pruner))
            return
        full = run_search(Path(folder) / "full", base, args.trials, "none", args.seed, args.method)
    print(report(pruned, full, args.pruner))


if __name__ == "__main__":
    main()

"""How a job ended, and writing that down: succeeded, cancelled or failed, with why."""

from __future__ import annotations

import dataclasses
import logging
import traceback
import uuid
from dataclasses import dataclass
from typing import Any

from core import jobs
from core.db.session import session_scope
from core.redaction import public_text
from core.settings import Settings
from worker.watchdog import Watchdog

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Outcome:
    """How a job ended, for `core.jobs.finish`."""

    status: str
    summary: dict[str, Any] | None = None
    error: str | None = None
    details: str | None = None  # a traceback for the worker's log, never for clients


def of_run(summary: dict[str, Any], watchdog: Watchdog, pruned: str | None = None) -> Outcome:
    """Succeeded, or, for a run stopped early on request, cancelled, pruned (`pruned`: its
    search's pruner stopped it, and why) or failed for its time limit. A run its early stop
    ended on a plateau (`ended.reason`) succeeded."""
    if watchdog.lost.is_set():
        raise jobs.LeaseLost(f"job {watchdog.claim.job_id} lost its lease")
    ended = summary.get("ended") or {}
    if not summary.get("stopped") or ended.get("reason") == "plateau":
        return Outcome("succeeded", summary)
    if watchdog.cancelled.is_set():
        return Outcome("cancelled", summary)
    if pruned is not None:
        ended = {"reason": "pruned", "message": pruned, "step": summary.get("steps")}
        return Outcome("pruned", {**summary, "ended": ended})
    limit = f"{watchdog.limits.soft_s:.0f} s"
    reason = f"exceeded its time limit of {limit} (estimated from its budget; MAX_JOB_SECONDS)"
    return Outcome("failed", summary, reason)


def failure(error: BaseException) -> Outcome:
    """A failed outcome: a one-line reason, and the traceback for the worker's log."""
    lines = str(error).strip().splitlines()
    reason = f"{type(error).__name__}: {lines[0] if lines else 'no message'}"
    details = "".join(traceback.format_exception(error))
    return Outcome("failed", error=reason[:1000], details=details)


def record(
    settings: Settings, claim: jobs.Claim, outcome: Outcome, progress: dict[str, int]
) -> None:
    """Write the final progress and the outcome; a failure's traceback goes to the worker's
    log under an error id that the job's event cites, its reason without server paths."""
    if outcome.error:
        outcome = dataclasses.replace(outcome, error=public_text(outcome.error, settings))
    if outcome.details:
        error_id = uuid.uuid4().hex
        log.error("job %s failed, error id %s:\n%s", claim.job_id, error_id, outcome.details)
        outcome = dataclasses.replace(
            outcome, details=f"error id {error_id}: the traceback is in the worker's log"
        )
    try:
        with session_scope(settings.database_url) as session:
            jobs.heartbeat(
                session=session,
                job_id=claim.job_id,
                token=claim.token,
                lease_seconds=settings.lease_seconds,
                **progress,
            )
            if outcome.details:
                jobs.add_event(
                    session=session,
                    job_id=claim.job_id,
                    level="error",
                    message=outcome.details,
                    token=claim.token,
                )
            jobs.finish(
                session=session,
                job_id=claim.job_id,
                token=claim.token,
                status=outcome.status,
                error=outcome.error,
                summary=outcome.summary,
            )
    except jobs.LeaseLost:
        log.warning("job %s: lease lost before its outcome was written", claim.job_id)
        return
    log.info("job %s: %s", claim.job_id, outcome.status)

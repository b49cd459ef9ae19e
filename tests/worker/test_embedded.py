"""The embedded default's parts: SQLite and kombu's SQLAlchemy transport, a real worker."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from core.kinds import EvaluateJobSpec
from tests.helpers import (
    checkpoint_rows,
    messages,
    metric_counts,
    metric_steps,
    submit,
    train_spec,
    wait_status,
)
from tests.services import Service, make_settings
from training.checkpoints import sha256_of

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def embedded(sqlite_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """One worker on a SQLite database, with a SQLite file as its broker."""
    root = tmp_path_factory.mktemp("embedded")
    broker = f"sqla+sqlite:///{root / 'broker.db'}"
    running = Service(make_settings(sqlite_url, broker, root), root)
    try:
        running.start("solo")
        yield running
    finally:
        running.stop()


def test_submit_train_then_evaluate_on_sqlite(embedded: Service) -> None:
    url = embedded.url
    train_id = submit(embedded.settings, train_spec(epochs=2))
    done = wait_status(url, train_id, "succeeded")
    assert (done.attempt, done.step, done.total_steps) == (1, 44, 44)
    assert done.final_test_error is not None
    assert metric_steps(url, train_id, "train/loss") == [11, 22, 33, 44]
    rows, distinct = metric_counts(url, train_id)
    assert rows == distinct
    assert messages(url, train_id)[-1] == "succeeded"
    saved = checkpoint_rows(url, train_id)
    assert saved
    assert all(sha256_of(Path(row.path)) == row.sha256 for row in saved)

    spec = EvaluateJobSpec.model_validate(
        {
            "kind": "evaluate",
            "source_job": str(train_id),
            "checkpoint": "last",
            "dataset": {"name": "digits", "validation": 0},
        }
    )
    evaluation = wait_status(url, submit(embedded.settings, spec), "succeeded")
    assert evaluation.summary is not None
    assert evaluation.summary["checkpoint"]["step"] == 44
    assert evaluation.final_test_error == pytest.approx(done.final_test_error, abs=1e-9)
    assert sum(map(sum, evaluation.summary["confusion"])) == evaluation.summary["count"]

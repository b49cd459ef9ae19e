"""The queue on the embedded broker (kombu's SQLAlchemy transport on SQLite)."""

from __future__ import annotations

import gc
from pathlib import Path

from core import queue
from core.settings import Settings


def test_reading_the_queue_depth_again_and_again_holds_no_broker_connection(
    tmp_path: Path,
) -> None:
    # The reaper and /metrics read the depth every few seconds for the life of a process.
    # The broker's connection pool holds 15; a read that kept one would make the 16th wait
    # 30 s and fail, and stop the worker, as it once did after 80 minutes of a study.
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'service.db'}",
        broker_url=f"sqla+sqlite:///{tmp_path / 'broker.db'}",
    )
    gc.disable()  # a read's connection must come back at once, not when a collection runs
    try:
        assert [queue.depth(settings, timeout=2) for _ in range(20)] == [0] * 20
    finally:
        gc.enable()

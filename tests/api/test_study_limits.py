"""What one study may ask of the API, on Postgres and SQLite: its size is refused from its
axes' lengths before a cell is made, its net families are bounded before admission counts
any, odd bodies are a 4xx with a message, and the counting leaves the event loop free."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from api.app import create_app
from core.db.session import session_scope
from core.db.tables import Job, Study
from core.settings import Settings
from models import zoo
from tests.helpers import make_key, peak_rss_mb, reset_peak_rss
from tests.services import serve

STUDIES = "/api/v1/studies"
BASE = {
    "model": {"name": "resnet8"},
    "dataset": {"name": "digits"},
    "recipe": {"epochs": 1, "batch_size": 64, "augment": False},
}
SYNTHETIC = {**BASE, "dataset": {"name": "synthetic", "channels": 1, "train_size": 64}}


@pytest.fixture(scope="module")
def on_database(settings: Settings, database_url: str) -> Iterator[tuple[TestClient, str]]:
    """A client with a train key of the app on each database, and that database's URL."""
    changed = settings.model_copy(update={"database_url": database_url})
    key = make_key(database_url, "read", "train")
    with TestClient(create_app(changed), headers={"Authorization": f"Bearer {key}"}) as client:
        yield client, database_url


def _rows(url: str) -> tuple[int, int]:
    with session_scope(url) as session:
        studies = session.scalar(select(func.count()).select_from(Study)) or 0
        return studies, session.scalar(select(func.count()).select_from(Job)) or 0


def _nested(depth: int) -> str:
    return '{"a": ' * depth + "1" + "}" * depth


def test_a_grid_of_ten_billion_cells_is_refused_from_its_axes_lengths(
    on_database: tuple[TestClient, str],
) -> None:
    """10 axes x 10 values: a 422 at once with the process's memory as it was. Multiplied
    out first, 3 axes x 100 values took 2-3.6 s and 196 MB, and these would take the API's
    memory."""
    client, _ = on_database
    grid = {f"recipe.lr{axis}": [0.1] * 10 for axis in range(10)}
    client.get(STUDIES)  # the app's first request pays for its key check and connections
    before = reset_peak_rss()
    started = time.perf_counter()
    answer = client.post(STUDIES, json={"base": BASE, "grid": grid}, params={"dry_run": True})
    took = time.perf_counter() - started
    grown = peak_rss_mb() - before
    assert answer.status_code == 422
    message = answer.json()["error"]["message"]
    assert message.startswith("the study has 10000000000 cells (10 x 10 x 10 x 10 x 10 x 10")
    assert "over the limit of 1000; use fewer axis values or seeds (MAX_STUDY_JOBS)" in message
    assert took < 1.0, f"refused in {took:.2f} s"
    assert grown < 20, f"the peak memory grew {grown:.0f} MB"


DIGITS = '{"model": {"name": "resnet8"}, "dataset": {"name": "digits"}}'


def _study(grid: str, base: str = DIGITS) -> str:
    """A study's JSON body from the JSON of its grid and base."""
    return '{"base": ' + base + ', "grid": ' + grid + "}"


DEEP_UNIT = '{"model": {"name": "resnet8", "options": {"unit": ' + _nested(900) + "}}, "
ODD_BODIES = [
    # A base nested past Python's recursion was a 500 (copying it for each cell).
    (
        _study('{"recipe.lr": [0.1]}', DEEP_UNIT + '"dataset": {"name": "digits"}}'),
        ["body", "base"],
        "the study's base nests objects and lists more than 16 levels deep",
    ),
    (
        _study('{"recipe.lr": [0.1]}', DIGITS[:-1] + ', "x": ' + _nested(600) + "}"),
        ["body", "base"],
        "more than 16 levels deep",
    ),
    (
        _study('{"options.unit": [' + _nested(900) + "]}"),
        ["body", "grid", "options.unit"],
        "grid axis 'options.unit' has a value that nests objects and lists more than 15",
    ),
    (
        _study('{"recipe.epochs": [' + "9" * 4000 + "]}"),
        ["body", "grid", "recipe.epochs"],
        f"cell 0 (recipe.epochs={'9' * 57}...)",
    ),
    (
        _study('{"recipe.lr": [NaN]}'),
        ["body", "grid", "recipe.lr"],
        "cell 0 (recipe.lr=nan): recipe.lr: Input should be less than or equal to 10",
    ),
    (
        _study('{"model.name": [1, null, {}, []]}'),
        ["body", "grid", "model.name"],
        "cell 0 (model.name=1): model.name: Input should be a valid string",
    ),
    (
        _study('{"recipe.seed": [1, 2]}'),
        ["body", "grid", "recipe.seed"],
        "grid axis 'recipe.seed' would be replaced by each job's seed",
    ),
    (
        _study(json.dumps({f"options.o{axis}": [1] for axis in range(17)})),
        ["body", "grid"],
        "the grid has 17 axes, over the limit of 16",
    ),
]


@pytest.mark.parametrize("dry_run", [True, False])
@pytest.mark.parametrize(("body", "loc", "message"), ODD_BODIES)
def test_odd_study_bodies_are_a_422_naming_the_field_and_nothing_is_written(
    on_database: tuple[TestClient, str], body: str, loc: list[str], message: str, dry_run: bool
) -> None:
    client, url = on_database
    before = _rows(url)
    answer = client.post(
        STUDIES,
        content=body,
        params={"dry_run": dry_run},
        headers={"Content-Type": "application/json"},
    )
    assert answer.status_code == 422, answer.text
    error = answer.json()["error"]
    assert message in error["message"]
    assert error["details"][0]["loc"] == loc
    assert _rows(url) == before


def test_net_families_past_the_limit_are_refused_before_admission_counts_one(
    on_database: tuple[TestClient, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """17 image sizes are 17 families over MAX_STUDY_NET_FAMILIES = 16: a 422 with no net
    of the grid's sizes counted (each would take a second or more); the degradation grid's
    10 depths of two families pass."""
    client, _ = on_database
    sizes = range(100, 117)
    grid = {"dataset.image_size": list(sizes), "recipe.lr": [0.1, 0.05]}
    measured: list[int] = []
    forward_costs = zoo._forward_costs

    def recorded(arch: Any, num_classes: int, in_channels: int, size: int, **kw: Any) -> Any:
        measured.append(size)
        return forward_costs(arch, num_classes, in_channels, size, **kw)

    # Counted by size, not by the caches' misses: the base's own count may be evicted from a
    # full cache by other tests in this process and counted again.
    monkeypatch.setattr(zoo, "_forward_costs", recorded)
    answer = client.post(STUDIES, json={"base": SYNTHETIC, "grid": grid}, params={"dry_run": True})
    assert answer.status_code == 422
    error = answer.json()["error"]
    assert error["message"].startswith(
        "the study's cells have more than 16 net families, over MAX_STUDY_NET_FAMILIES = 16: "
        "cell 32 (dataset.image_size=116, recipe.lr=0.1) starts family 17."
    )
    assert error["details"][0]["loc"] == ["body", "grid"]
    assert not set(measured) & set(sizes)  # refused before any of the grid's nets

    depths = [f"{family}{depth}" for family in ("plain", "resnet") for depth in (8, 14, 20, 26, 32)]
    body = {"base": BASE, "grid": {"model.name": depths, "recipe.lr": [0.1, 0.05]}}
    assert client.post(STUDIES, json=body, params={"dry_run": True}).json()["jobs"] == 20


def test_the_family_limit_is_a_setting_and_counts_options_and_shapes_not_depths(
    settings: Settings,
) -> None:
    tight = settings.model_copy(update={"max_study_net_families": 2})
    key = make_key(settings.database_url, "read", "train")
    with TestClient(create_app(tight), headers={"Authorization": f"Bearer {key}"}) as client:
        depths = {"model.name": ["resnet8", "resnet14", "resnet20", "plain8", "plain20"]}
        fits = client.post(STUDIES, json={"base": BASE, "grid": depths}, params={"dry_run": True})
        assert fits.status_code == 200, fits.text
        units = ["original", "full_preact", "bn_after_add"]
        grid = {"model.name": ["resnet8", "resnet14"], "options.unit": units}
        answer = client.post(STUDIES, json={"base": BASE, "grid": grid})
        assert answer.status_code == 422
        assert answer.json()["error"]["message"].startswith(
            "the study's cells have more than 2 net families, over MAX_STUDY_NET_FAMILIES = 2: "
            "cell 2 (model.name='resnet8', options.unit='bn_after_add') starts family 3."
        )


def test_counting_a_studys_nets_leaves_the_event_loop_free(settings: Settings) -> None:
    """A dry run that counts two families no other test counts (seconds on the meta device,
    in the route's worker thread) while /healthz answers at once."""
    auth = {"Authorization": f"Bearer {make_key(settings.database_url, 'read', 'train')}"}
    grid: dict[str, list[Any]] = {"dataset.image_size": [61, 67], "recipe.lr": [0.1, 0.05]}
    counted = zoo._measure.cache_info().misses
    answers: list[httpx.Response] = []
    with serve(create_app(settings)) as url, httpx.Client(base_url=url, timeout=120) as http:
        # FastAPI builds its routes' state at their first request, on the loop: not this.
        warm = http.post(STUDIES, json={"base": SYNTHETIC, "grid": {"colour": [1]}}, headers=auth)
        assert warm.status_code == 422
        poster = threading.Thread(
            target=lambda: answers.append(
                http.post(
                    STUDIES,
                    json={"base": SYNTHETIC, "grid": grid},
                    params={"dry_run": True},
                    headers=auth,
                )
            )
        )
        started = time.perf_counter()
        poster.start()
        worst = 0.0
        while poster.is_alive():
            sent = time.perf_counter()
            assert http.get("/api/v1/healthz").status_code == 200
            worst = max(worst, time.perf_counter() - sent)
            time.sleep(0.01)
        took = time.perf_counter() - started
    (answer,) = answers
    assert answer.status_code == 200, answer.text
    assert answer.json()["jobs"] == 4
    assert zoo._measure.cache_info().misses >= counted + 2  # both families were counted
    assert worst < 0.5, f"/healthz waited {worst:.2f} s while the dry run took {took:.1f} s"

"""The studies pages in headless Chromium against the real API and Postgres. No worker runs
here: a test that needs results runs a study's jobs by hand in the database, with made-up
curves whose medians it knows."""

from __future__ import annotations

import re
import uuid
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, expect
from sqlalchemy import select

from core import jobs
from core.db.session import session_scope
from core.db.tables import Job
from tests.dashboard.helpers import Server, chart_data, open_page, screenshot, visit
from tests.helpers import claim, finish, make_key

pytestmark = pytest.mark.slow

STUDIES = "/api/v1/studies"
TINY = {
    "base": {"model": {"name": "resnet8"}, "dataset": {"name": "digits"}, "recipe": {"epochs": 1}},
    "grid": {"model.name": ["plain8", "resnet8"]},
    "seeds": 2,
    "name": "tiny plain against residual",
}
STEPS = (100, 200, 300)  # the iterations each made-up job logs at
UUID = r"[0-9a-f-]{36}"
DASH, TIMES = "\N{EN DASH}", "\N{MULTIPLICATION SIGN}"  # as the page prints a range, a product


def _spread(median: str, low: str, high: str) -> str:
    """An error over seeds as the table shows it: the median (min-max), in %."""
    return f"{median} ({low}{DASH}{high})"


def _create(server: Server, body: dict[str, Any]) -> dict[str, Any]:
    with server.client() as client:
        response = client.post(STUDIES, json=body)
    assert response.status_code == 202, response.text
    return dict(response.json())


def _error(model: str, metric: str, logged: int, seed: int) -> float:
    """A made-up error: plain nets start higher, and worse the deeper they are past 8
    layers, residual nets better (2015 Fig. 6); test above train; falls 0.1 at each of the
    `logged` points; each seed adds 0.02, so two seeds' median is their mean, their range 0.02."""
    plain = model.startswith("plain")
    depth = int(model.removeprefix("plain" if plain else "resnet"))
    start = 0.9 if plain else 0.8
    start += 0.002 * (depth - 8) * (1 if plain else -1)
    start += 0.05 if metric == "test/error" else 0
    return start - 0.1 * logged + 0.02 * seed


def _finish_all(server: Server, study_id: str) -> None:
    """Run every job of the study by hand: its curves, then its summary (best test error
    0.01 per seed under the final)."""
    url = server.settings.database_url
    with session_scope(url) as session:
        rows = session.execute(
            select(Job.id, Job.spec).where(Job.study_id == uuid.UUID(study_id))
        ).all()
    for job_id, spec in rows:
        model, seed = spec["model"]["name"], spec["recipe"]["seed"]
        with session_scope(url) as session:
            session.get(Job, job_id).held = False  # type: ignore[union-attr]
        token = claim(url, job_id)
        points = [
            jobs.Point(metric, step, _error(model, metric, logged, seed))
            for metric in ("train/error", "test/error")
            for logged, step in enumerate(STEPS, start=1)
        ]
        with session_scope(url) as session:
            jobs.write_metrics(session=session, job_id=job_id, token=token, points=points)
        final = _error(model, "test/error", len(STEPS), seed)
        best = final - 0.01 * (seed + 1)
        finish(url, job_id, token, final_test_error=final, best_test_error=best)


def _traces(page: Page) -> list[dict[str, Any]]:
    """The figure's curves (not its empty panel anchors): chart_data's fields, with the
    panel's axis, the dash and the fill."""
    drawn = chart_data(page, "#chart-study")
    extra = page.evaluate(
        """() => document.querySelector("#chart-study").data.map((t) => ({
            xaxis: t.xaxis ?? "x", dash: t.line?.dash ?? null, fill: t.fill ?? null }))"""
    )
    traces = [{**trace, **more} for trace, more in zip(drawn, extra, strict=True)]
    return [trace for trace in traces if trace["meta"]["part"] != "panel"]


@pytest.fixture(scope="module")
def tiny(server: Server) -> dict[str, Any]:
    """The tiny grid, 2 cells x 2 seeds, every job finished with made-up results."""
    study = _create(server, TINY)
    _finish_all(server, study["id"])
    return study


def test_a_study_page_shows_its_figure_table_jobs_and_files(
    page: Page, server: Server, tiny: dict[str, Any]
) -> None:
    visit(page, server, f"#/studies/{tiny['id']}")
    expect(page.locator("h1 .status")).to_have_text("succeeded")
    expect(page.locator("#study-done")).to_have_text("4 / 4 jobs done")
    rows = page.locator("#study-table tbody tr")
    expect(rows).to_have_count(2)
    plain, residual = rows.nth(0), rows.nth(1)
    expect(plain.locator("td").first).to_have_text("plain8")
    expect(plain.locator("[data-col=seeds]")).to_have_text("2/2")
    # Medians (min-max) in % of the made-up errors: each seed adds 0.02, best is 0.01 a seed
    # under the final test error.
    shown = {
        (plain, "final_train_error"): ("61.00", "60.00", "62.00"),
        (plain, "final_test_error"): ("66.00", "65.00", "67.00"),
        (plain, "best_test_error"): ("64.50", "64.00", "65.00"),
        (residual, "final_train_error"): ("51.00", "50.00", "52.00"),
        (residual, "final_test_error"): ("56.00", "55.00", "57.00"),
    }
    for (row, column), (median, low, high) in shown.items():
        expect(row.locator(f"[data-col={column}]")).to_have_text(_spread(median, low, high))
    expect(plain.locator("[data-col=paper]")).to_have_text(DASH)  # a custom grid has none

    links = page.locator("#study-table a[href^='#/runs/']")
    expect(links).to_have_count(4)
    hrefs = set(links.evaluate_all("(links) => links.map((a) => a.getAttribute('href'))"))
    assert hrefs == {f"#/runs/{job['id']}" for job in tiny["jobs"]}
    expect(plain.locator("a")).to_have_text(["seed 0", "seed 1"])

    traces = _traces(page)
    assert len(traces) == 12  # 2 cells x (train, test) x (lower edge, upper edge, median)
    medians = {
        (t["meta"]["cell"], t["meta"]["metric"]): t for t in traces if t["meta"]["part"] == "median"
    }
    train, test = medians[(0, "train/error")], medians[(0, "test/error")]
    assert train["x"] == list(STEPS)
    assert train["y"] == pytest.approx([81, 71, 61])
    assert (train["width"], train["dash"]) == (1, "dash")  # training error thin and dashed
    assert (test["width"], test["dash"]) == (3, None)  # test error bold
    assert test["y"] == pytest.approx([86, 76, 66])
    assert train["color"] == test["color"] != medians[(1, "test/error")]["color"]
    band = [t for t in traces if t["meta"]["cell"] == 0 and t["meta"]["metric"] == "train/error"]
    lower, upper = (next(t for t in band if t["meta"]["part"] == p) for p in ("lower", "upper"))
    assert lower["y"] == pytest.approx([80, 70, 60])
    assert upper["y"] == pytest.approx([82, 72, 62])
    assert upper["fill"] == "tonexty"  # filled down to the lower edge
    screenshot(page, "study")

    with page.expect_download() as download:
        page.click("#downloads a:text('CSV')")
    lines = download.value.path().read_text().splitlines()
    assert lines[0].startswith("model.name,seeds,")
    assert [line.split(",")[0] for line in lines[1:]] == ["plain8", "resnet8"]
    with page.expect_download() as download:
        page.click("#downloads a:text('Markdown')")
    assert "| plain8 | 2/2 | 61.00 (60.00-62.00) |" in download.value.path().read_text()


def test_the_list_shows_each_study_and_updates_while_one_runs(
    page: Page, server: Server, tiny: dict[str, Any]
) -> None:
    waiting = _create(server, {**TINY, "name": "still to run"})
    visit(page, server, "#/studies")
    expect(page.locator("nav a[data-page=studies]")).to_have_class(re.compile("active"))
    done = page.locator(f"#studies tr[data-id='{tiny['id']}']")
    expect(done.locator(".status")).to_have_text("succeeded")
    expect(done.locator(".done")).to_have_text("4 / 4")
    expect(done).to_contain_text("tiny plain against residual")
    expect(done).to_contain_text("custom")
    row = page.locator(f"#studies tr[data-id='{waiting['id']}']")
    expect(row.locator(".status")).to_have_text("queued")
    expect(row.locator(".done")).to_have_text("0 / 4")
    screenshot(page, "studies")

    _finish_all(server, waiting["id"])  # the page polls: no reload
    expect(row.locator(".status")).to_have_text("succeeded")
    expect(row.locator(".done")).to_have_text("4 / 4")
    row.locator("a").click()
    expect(page).to_have_url(re.compile(f"#/studies/{waiting['id']}$"))
    expect(page.locator("h1")).to_contain_text("still to run")


def test_a_degradation_study_draws_plain_and_residual_nets_side_by_side(
    page: Page, server: Server
) -> None:
    body = {"preset": "degradation", "dataset": {"name": "fashion_mnist"}, "seeds": 1}
    study = _create(server, body)
    visit(page, server, f"#/studies/{study['id']}")
    expect(page.locator("h1 .status")).to_have_text("queued")
    # Before any result: two empty panels, plain nets left and residual nets right.
    expect(page.locator("#chart-study .subplot.xy")).to_have_count(1)
    expect(page.locator("#chart-study .subplot.x2y2")).to_have_count(1)
    expect(page.locator("#chart-study .annotation")).to_have_text(["plain nets", "residual nets"])
    expect(page.locator("#study-source")).to_contain_text("Fig. 6")
    expect(page.locator("#study-note")).to_be_visible()

    _finish_all(server, study["id"])  # the page polls until the study ends
    expect(page.locator("h1 .status")).to_have_text("succeeded")
    expect(page.locator("#study-table tbody tr")).to_have_count(8)
    medians = [t for t in _traces(page) if t["meta"]["part"] == "median"]
    assert len(medians) == 16  # 8 nets x (train, test)
    names = {cell["cell"]: cell["values"]["model.name"] for cell in study["cells"]}
    for trace in medians:
        name = names[trace["meta"]["cell"]]
        assert trace["xaxis"] == ("x" if name.startswith("plain") else "x2"), name
    colour = {names[t["meta"]["cell"]]: t["color"] for t in medians}
    for depth in (20, 32, 44, 56):  # one colour per depth, the same in both panels
        assert colour[f"plain{depth}"] == colour[f"resnet{depth}"]
    assert len(set(colour.values())) == 4
    screenshot(page, "study-degradation")


def test_a_preset_with_the_papers_numbers_shows_ours_beside_theirs(
    page: Page, server: Server
) -> None:
    body = {"preset": "cifar_depth", "dataset": {"name": "fashion_mnist"}, "seeds": 1}
    study = _create(server, body)
    _finish_all(server, study["id"])
    visit(page, server, f"#/studies/{study['id']}")
    row = page.locator("#study-table tbody tr").first  # made up 52.60%; Table 6 gives 8.75%
    expect(row.locator("td").first).to_have_text("resnet20")
    expect(row.locator("[data-col=final_test_error]")).to_have_text("52.60")
    expect(row.locator("[data-col=paper]")).to_have_text("8.75")
    expect(row.locator("[data-col=difference]")).to_have_text("+43.85")
    expect(page.locator("th.measure")).to_have_text("final test error (%)")
    expect(page.locator("#study-source")).to_contain_text("Table 6")


def test_the_new_study_form_counts_the_jobs_by_a_dry_run_and_submits(
    page: Page, server: Server
) -> None:
    body = {"preset": "degradation", "dataset": {"name": "fashion_mnist"}, "seeds": 3}
    with server.client() as client:
        cells = len(client.post(STUDIES, params={"dry_run": True}, json=body).json()["cells"])
    visit(page, server, "#/studies")
    page.click("#new-study")
    expect(page).to_have_url(re.compile("#/studies/new$"))
    page.select_option("select[name=preset]", "degradation")
    expect(page.locator("select[name=dataset]")).to_have_value("fashion_mnist")
    expect(page.locator("input[name=seeds]")).to_have_value("3")
    count = page.locator("#study-count")
    expect(count).to_contain_text(f"{cells} cells {TIMES} 3 seeds = {cells * 3} jobs")
    expect(page.locator("#preset-about")).to_contain_text("Fig. 6")
    expect(page.locator("#preset-recipe")).to_contain_text("Recipe (quick)")
    screenshot(page, "new-study")

    page.fill("input[name=seeds]", "1")
    expect(count).to_contain_text(f"{cells} cells {TIMES} 1 seeds = {cells} jobs")
    page.select_option("select[name=dataset]", "imagefolder")  # it needs a path
    expect(page.locator("#study-error")).to_contain_text("dataset.path")
    expect(page.locator("#submit-study")).to_be_disabled()
    page.select_option("select[name=dataset]", "fashion_mnist")
    page.fill("input[name=seeds]", "3")
    expect(count).to_contain_text(f"= {cells * 3} jobs")
    expect(page.locator("#submit-study")).to_be_enabled()

    page.click("#submit-study")
    expect(page).to_have_url(re.compile(f"#/studies/{UUID}$"))
    expect(page.locator("h1")).to_contain_text("Plain against residual nets")
    expect(page.locator("#study-done")).to_have_text(f"0 / {cells * 3} jobs done")


def test_a_train_key_cancels_and_deletes_a_study(page: Page, server: Server) -> None:
    study = _create(server, {**TINY, "name": "to delete"})
    visit(page, server, f"#/studies/{study['id']}")
    expect(page.locator("#actions button[data-action=delete]")).to_have_count(0)
    page.click("#actions button[data-action=cancel]")
    expect(page.locator("h1 .status")).to_have_text("cancelled")
    expect(page.locator("#study-table tbody tr").first.locator("[data-col=seeds]")).to_have_text(
        "0/2 (2 cancelled)"
    )
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#actions button[data-action=delete]")
    expect(page).to_have_url(re.compile("#/studies$"))
    expect(page.locator(f"#studies tr[data-id='{study['id']}']")).to_have_count(0)
    with server.client() as client:
        assert client.get(f"{STUDIES}/{study['id']}").status_code == 404


def test_a_read_key_sees_no_write_buttons(
    browser: Browser, server: Server, tiny: dict[str, Any]
) -> None:
    errors: list[str] = []
    tab = open_page(browser, server, make_key(server.settings.database_url, "read"), errors)
    try:
        visit(tab, server, "#/studies")
        expect(tab.locator(f"#studies tr[data-id='{tiny['id']}']")).to_be_visible()
        expect(tab.locator("#new-study")).to_have_count(0)
        visit(tab, server, f"#/studies/{tiny['id']}")
        expect(tab.locator("#study-table tbody tr")).to_have_count(2)
        expect(tab.locator("#downloads a")).to_have_count(2)
        expect(tab.locator("#actions button")).to_have_count(0)
    finally:
        tab.context.close()
    assert not errors

"""A search study's page in headless Chromium against the real API and Postgres: its trials
are written straight into the database, as a search leaves them."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

from tests.dashboard.helpers import Server, chart_data, screenshot, visit
from tests.searches import DECAY, LR, MADE, write_search

pytestmark = pytest.mark.slow


def test_a_search_page_shows_its_best_trial_parallel_coordinates_and_trials(
    page: Page, server: Server
) -> None:
    study_id = write_search(server.settings.database_url, MADE)
    visit(page, server, f"#/studies/{study_id}")
    expect(page.locator("#search-best-value")).to_have_text("0.2000")
    expect(page.locator(f"#search-best [data-param='{LR}']")).to_have_text("0.05000")
    expect(page.locator("#search-summary")).to_contain_text("tpe search of 6 trials")

    chart = page.locator("#parallel-coordinates")
    expect(chart.locator("polyline")).to_have_count(4)  # one per completed or pruned trial
    expect(chart.locator("polyline[data-status=pruned]")).to_have_count(1)
    assert chart.locator("polyline[data-status=pruned]").get_attribute("stroke-dasharray")
    drawn = chart.locator("polyline[data-status=succeeded]").evaluate_all(
        "(lines) => lines.map((l) => [Number(l.dataset.trial), l.getAttribute('points')])"
    )
    assert sorted(trial for trial, _ in drawn) == [0, 2, 4]
    assert all(len(points.split()) == 3 for _, points in drawn)  # lr, decay, objective
    axes = chart.locator("g.axis").evaluate_all("(axes) => axes.map((a) => a.dataset.path)")
    assert axes == [LR, DECAY, "val/error"]
    box = chart.bounding_box()
    assert box is not None
    assert box["width"] > 500
    assert box["height"] > 150

    so_far = {t["meta"]["part"]: t for t in chart_data(page, "#chart-best-so-far")}
    assert so_far["best"]["x"] == [0, 2, 4]
    assert so_far["best"]["y"] == pytest.approx([0.32, 0.2, 0.2])
    bars = chart_data(page, "#chart-importances")
    assert set(bars[0]["y"]) == {LR, DECAY}

    rows = page.locator("#trials-table tbody tr")
    expect(rows).to_have_count(6)
    expect(rows.nth(1).locator(".status")).to_have_text("pruned")
    expect(rows.nth(1).locator("[data-col=pruned_at]")).to_have_text("100")
    page.click("#trials-table th[data-sort=value]")
    expect(rows.first.locator("[data-col=trial]")).to_have_text("3")  # failed at 0.1, lowest
    expect(rows.nth(1).locator("[data-col=trial]")).to_have_text("2")
    expect(rows.last.locator("[data-col=value]")).to_have_text("\N{EN DASH}")  # none yet
    screenshot(page, "study-search")

"""The dashboard in headless Chromium against the real API and Postgres (no worker here:
jobs stay queued): the runs table, the new-job form's errors, and auth."""

from __future__ import annotations

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.dashboard.helpers import Server, open_page, screenshot, visit
from tests.helpers import make_key, new_job

pytestmark = pytest.mark.slow

FILLERS = 52  # with the 3 named jobs: 55 runs, two pages of 50


def _submit(server: Server, name: str, model: str, tags: list[str]) -> str:
    spec = {
        "kind": "train",
        "name": name,
        "tags": tags,
        "model": {"name": model},
        "dataset": {"name": "digits"},
        "recipe": {"epochs": 1},
    }
    with server.client() as client:
        response = client.post("/api/v1/jobs", json=spec)
    assert response.status_code == 202, response.text
    job_id: str = response.json()["id"]
    return job_id


@pytest.fixture(scope="module")
def named_jobs(server: Server) -> dict[str, str]:
    """52 filler jobs made in the database, then three named ones through the API."""
    for number in range(FILLERS):
        new_job(server.settings.database_url, name=f"filler-{number:02d}")
    return {
        name: _submit(server, name, model, tags)
        for name, model, tags in [
            ("r20-a", "resnet20", ["fig6"]),
            ("p20-b", "plain20", []),
            ("r56-c", "resnet56", ["fig6"]),
        ]
    }


def _names(page: Page) -> list[str]:
    return page.locator("#runs tbody tr td:nth-child(2) a").all_inner_texts()


def test_runs_page_lists_filters_sorts_and_pages(
    page: Page, server: Server, named_jobs: dict[str, str]
) -> None:
    visit(page, server, "#/runs")
    rows = page.locator("#runs tbody tr")
    expect(rows).to_have_count(50)
    assert _names(page)[:3] == ["r56-c", "p20-b", "r20-a"]  # newest first
    first = page.locator(f"#runs tr[data-id='{named_jobs['r56-c']}']")
    expect(first.locator(".status")).to_have_text("queued")
    expect(first).to_contain_text("resnet56")
    expect(first).to_contain_text("digits")
    expect(first.locator(".tag")).to_have_text("fig6")
    screenshot(page, "runs")
    # The kind and family choices are the API's, so a new kind or family needs no JS change.
    with server.client() as client:
        kinds = [kind["kind"] for kind in client.get("/api/v1/jobs/kinds").json()]
    offered = page.locator("#filters select[name=kind] option").evaluate_all(
        "options => options.map(o => o.value).filter(v => v)"
    )
    assert offered == kinds == ["train", "evaluate", "predict", "import"]
    page.select_option("#filters select[name=kind]", "evaluate")
    expect(rows).to_have_text(["No runs match."])
    page.select_option("#filters select[name=kind]", "")
    expect(rows).to_have_count(50)

    page.select_option("#filters select[name=family]", "plain")
    expect(rows).to_have_count(1)
    assert _names(page) == ["p20-b"]

    page.select_option("#filters select[name=family]", "")
    page.fill("#filters input[name=tag]", "fig6")
    page.press("#filters input[name=tag]", "Tab")
    expect(rows).to_have_count(2)
    assert _names(page) == ["r56-c", "r20-a"]
    page.select_option("#filters select[name=sort]", "created")  # oldest first
    expect(rows.first).to_contain_text("r20-a")
    assert _names(page) == ["r20-a", "r56-c"]

    page.fill("#filters input[name=tag]", "")
    page.press("#filters input[name=tag]", "Tab")
    expect(rows).to_have_count(50)
    assert _names(page)[0] == "filler-00"
    page.click("#next-page")
    expect(rows).to_have_count(5)
    assert _names(page)[-1] == "r56-c"
    page.click("#prev-page")
    expect(rows).to_have_count(50)


def test_new_job_form_shows_each_error_next_to_its_field(page: Page, server: Server) -> None:
    visit(page, server, "#/new")
    expect(page.locator("[data-loc='model.options.shortcut']")).to_be_visible()
    page.select_option("select[name=family]", "plain")  # plain nets have no shortcut option
    expect(page.locator("[data-loc='model.options.shortcut']")).to_be_hidden()
    page.select_option("select[name=family]", "resnet")
    page.select_option("select[name='option.shortcut_variant']", "exclusive_gating")
    expect(page.locator("[data-loc='model.options.gate_bias']")).to_be_visible()
    page.select_option("select[name='option.shortcut_variant']", "")

    page.fill("input[name=model]", "resnet8")
    page.fill("input[name='recipe.lr']", "-1")
    page.fill("input[name='recipe.batch_size']", "0")
    page.click("#submit-job")
    lr_error = page.locator("[data-loc='recipe.lr'] .field-error")
    expect(lr_error).to_contain_text("greater than 0")
    expect(page.locator("[data-loc='recipe.batch_size'] .field-error")).to_contain_text(
        "greater than or equal to 1"
    )
    expect(page.locator("[data-loc='model.name'] .field-error")).to_have_text("")
    screenshot(page, "new-job-errors")

    page.fill("input[name='recipe.lr']", "0.1")
    page.fill("input[name='recipe.batch_size']", "")
    page.fill("input[name=model]", "resnet21")
    page.click("#submit-job")
    expect(page.locator("[data-loc='model'] > .field-error")).to_contain_text("6n+2")
    expect(lr_error).to_have_text("")
    assert page.url.endswith("#/new")  # nothing was submitted


def test_the_new_job_form_offers_the_options_the_api_lists(page: Page, server: Server) -> None:
    with server.client() as client:
        answer = client.get("/api/v1/models/options").json()
    # A value that only the API's answer has: the page can know it from nowhere else.
    options = answer["options"]
    variants = next(option for option in options if option["name"] == "shortcut_variant")
    variants["choices"].append({"value": "made_up", "label": "a variant of this test"})
    page.route(f"{server.url}/api/v1/models/options", lambda route: route.fulfill(json=answer))
    visit(page, server, "#/new")

    families = page.locator("select[name=family] option").all_inner_texts()
    assert families == answer["families"]
    for option in options:
        field = page.locator(f"[data-loc='model.options.{option['name']}']")
        expect(field).to_have_attribute("title", option["description"])
        if option["kind"] == "choice":
            shown = field.locator("option")
            values = shown.evaluate_all("(options) => options.map((o) => o.value)")
            assert values == ["", *(choice["value"] for choice in option["choices"])]
            assert shown.all_inner_texts()[1:] == [c["label"] for c in option["choices"]]
        elif option["kind"] == "number":
            placeholder = f"{option['default']:g}"  # as JavaScript writes the number
            expect(field.locator("input")).to_have_attribute("placeholder", placeholder)
    page.select_option("select[name='option.shortcut_variant']", "conv1x1")
    expect(page.locator("[data-loc='model.options.shortcut']")).to_be_hidden()  # all 1x1 convs


def test_without_a_key_the_dashboard_asks_for_one(
    browser: Browser, server: Server, named_jobs: dict[str, str]
) -> None:
    errors: list[str] = []
    tab = open_page(browser, server, None, errors)
    try:
        visit_started = tab.goto(f"{server.url}/#/runs")
        assert visit_started is not None
        expect(tab.locator("#auth")).to_be_visible()
        read_only = _key(server, "read")
        tab.fill("#auth-key", read_only)
        tab.click("#auth button[type=submit]")
        tab.wait_for_selector("body[data-ready='1']")
        expect(tab.locator("#runs tbody tr").first).to_be_visible()
        assert tab.evaluate("sessionStorage.getItem('resnet-service.key')") == read_only
        expect(tab.locator("nav a[data-page=new]")).to_be_hidden()  # a read key cannot train
        expect(tab.locator("#who")).to_have_text("key: read")

        tab.goto(f"{server.url}/#/runs/{named_jobs['r20-a']}")
        expect(tab.locator("#facts")).to_contain_text("resnet20")
        expect(tab.locator("#actions button")).to_have_count(0)
    finally:
        tab.context.close()
    assert not errors


def test_a_train_key_sees_the_write_buttons(
    page: Page, server: Server, named_jobs: dict[str, str]
) -> None:
    visit(page, server, f"#/runs/{named_jobs['p20-b']}")
    expect(page.locator("#facts")).to_contain_text("plain20")
    expect(page.locator("nav a[data-page=new]")).to_be_visible()
    cancel = page.locator("#actions button[data-action=cancel]")
    expect(cancel).to_be_visible()
    cancel.click()
    expect(page.locator("h1 .status")).to_have_text("cancelled")
    expect(page.locator("#actions button[data-action=delete]")).to_be_visible()
    screenshot(page, "run-detail-cancelled")


def _key(server: Server, *scopes: str) -> str:
    return make_key(server.settings.database_url, *scopes)


def test_the_api_serves_every_script_itself(server: Server) -> None:
    with server.client() as client:
        page = client.get("/")
        plotly = client.get("/static/plotly.min.js")
        app = client.get("/static/app.js")
        outside = client.get("/static/..%2F..%2Fapp.py")
        session = client.get("/api/v1/whoami")
        read_only = client.get("/api/v1/whoami", headers=_bearer(_key(server, "read")))
    assert page.status_code == 200
    assert '<script type="module" src="/static/app.js">' in page.text
    assert "http" not in page.text.replace("http-equiv", "")  # nothing from elsewhere
    assert plotly.status_code == 200
    assert plotly.headers["cache-control"] == "public, max-age=31536000, immutable"
    assert plotly.headers["content-type"].startswith("text/javascript")
    assert len(plotly.content) > 1_000_000
    assert b"plotly.js" in plotly.content[:2000]
    assert app.status_code == 200
    assert app.headers["cache-control"] == "no-cache"
    assert outside.status_code == 404
    assert session.json() == {"auth_enabled": True, "scopes": ["predict", "read", "train"]}
    assert read_only.json() == {"auth_enabled": True, "scopes": ["read"]}


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}

"""The dashboard with a real worker: a job submitted through the form goes live to
`succeeded`, its curves are drawn from its metrics, runs compare on one chart, and an
evaluation draws its confusion matrix."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image
from playwright.sync_api import Page, expect

from core.settings import Settings
from tests.dashboard.helpers import Server, chart_data, screenshot, visit
from tests.helpers import recipe, wait_status
from tests.services import WorkerProcess, service_env
from training.data import TensorSplit
from training.datasets import load_dataset
from training.specs import DigitsSpec

pytestmark = pytest.mark.slow

EPOCHS = 2
STEPS = EPOCHS * 22  # digits, no validation split, batch 64: 22 steps per epoch


@pytest.fixture(scope="module")
def worker(settings: Settings, server: Server) -> Iterator[WorkerProcess]:
    """One `resnet-service worker` process on the test's database and broker."""
    root = settings.artifact_dir.parent
    process = WorkerProcess("dash", service_env(settings, settings.artifact_dir), root / "w.log")
    try:
        process.wait_ready()
        yield process
    finally:
        process.stop()


def _spec(name: str, model: str) -> dict[str, Any]:
    return {
        "kind": "train",
        "name": name,
        "model": {"name": model},
        "dataset": {"name": "digits", "validation": 0},
        "recipe": recipe(EPOCHS),
    }


def _submit(server: Server, spec: dict[str, Any]) -> uuid.UUID:
    with server.client() as client:
        response = client.post("/api/v1/jobs", json=spec)
    assert response.status_code == 202, response.text
    return uuid.UUID(response.json()["id"])


def _by_metric(traces: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {trace["meta"]["metric"]: trace for trace in traces}


def test_a_job_from_the_form_goes_live_to_succeeded_and_draws_its_curves(
    page: Page, server: Server, worker: WorkerProcess
) -> None:
    visit(page, server, "#/new")
    page.evaluate("window.sameDocument = true")  # gone if anything reloads the page
    page.fill("input[name=name]", "form-r8")
    page.fill("input[name=model]", "resnet8")
    page.select_option("select[name=dataset]", "digits")
    page.fill("input[name='dataset.validation']", "0")
    page.fill("input[name=budget_value]", str(EPOCHS))
    page.fill("input[name='recipe.batch_size']", "64")
    page.select_option("select[name='recipe.augment']", "false")
    page.fill("input[name='recipe.log_every']", "11")
    page.click("#submit-job")

    page.wait_for_url("**/#/runs?new=*")
    job_id = page.url.rsplit("new=", 1)[1]
    row = page.locator(f"#runs tr[data-id='{job_id}']")
    expect(row).to_contain_text("form-r8")
    expect(row.locator(".status")).to_have_text("succeeded", timeout=120_000)
    assert page.evaluate("window.sameDocument") is True
    expect(row).to_contain_text("75,002")  # resnet8's parameters, from the results
    screenshot(page, "runs-live")

    row.locator("a").click()
    expect(page.locator("#log")).to_contain_text("succeeded")
    page.wait_for_function(
        "document.querySelector('#chart-error')?.data?.some(t => t.meta?.metric === 'test/error')"
    )
    curves = _by_metric(chart_data(page, "#chart-error"))
    assert curves["train/error"]["x"] == list(range(11, STEPS + 1, 11))
    assert curves["test/error"]["x"] == [22, 44]
    assert all(0 <= y <= 100 for y in curves["train/error"]["y"])
    assert curves["test/error"]["y"][-1] < 50  # percent: resnet8 learns digits in 2 epochs
    assert curves["test/error"]["width"] > curves["train/error"]["width"]  # the papers' style
    lr = chart_data(page, "#chart-lr")
    assert lr[0]["x"] == list(range(11, STEPS + 1, 11))
    response_std = chart_data(page, "#chart-response-std")
    assert len(response_std[0]["y"]) == 3  # resnet8: one block per stage
    assert page.evaluate("window.sameDocument") is True
    screenshot(page, "run-detail")


def test_the_detail_page_of_a_queued_job_follows_it_live(
    page: Page, server: Server, worker: WorkerProcess
) -> None:
    # The worker runs one job at a time: while a long job holds it, the next one waits queued.
    url = server.settings.database_url
    blocker = _submit(server, {**_spec("blocker", "resnet8"), "recipe": recipe(1000)})
    wait_status(url, blocker, "running")
    job_id = _submit(server, _spec("live-plain8", "plain8"))
    visit(page, server, f"#/runs/{job_id}")
    expect(page.locator("h1 .status")).to_have_text("queued")
    assert page.locator("#chart-error").evaluate("div => div.data.length") == 0
    page.evaluate("window.sameDocument = true")
    with server.client() as client:
        assert client.post(f"/api/v1/jobs/{blocker}/cancel").status_code == 200

    expect(page.locator("h1 .status")).to_have_text("succeeded", timeout=120_000)
    page.wait_for_function(
        "document.querySelector('#chart-error')?.data?.some(t => t.meta?.metric === 'test/error')"
    )
    # The page opened before the job trained: its points came over the event stream.
    assert int(page.locator("#view").get_attribute("data-live-metrics") or 0) > 0
    assert page.evaluate("window.sameDocument") is True
    curves = _by_metric(chart_data(page, "#chart-error"))
    assert curves["test/error"]["x"] == [22, 44]
    expect(page.locator("#log")).to_contain_text("training plain8 on digits")
    expect(page.locator("#checkpoints")).to_contain_text("best")


def test_compare_draws_two_runs_on_one_chart_and_highlights_differences(
    page: Page, server: Server, worker: WorkerProcess
) -> None:
    ids = [
        _submit(server, _spec(name, model))
        for name, model in [("cmp-r8", "resnet8"), ("cmp-p8", "plain8")]
    ]
    for job_id in ids:
        wait_status(server.settings.database_url, job_id, "succeeded", timeout=120)
    visit(page, server, "#/runs")
    page.fill("#filters input[name=q]", "cmp-")
    page.press("#filters input[name=q]", "Tab")
    expect(page.locator("#runs tbody tr")).to_have_count(2)
    for job_id in ids:
        page.check(f"#runs tr[data-id='{job_id}'] input[type=checkbox]")
    page.click("#compare-selected")
    page.wait_for_function("document.querySelector('#chart-compare')?.data?.length >= 4")
    traces = chart_data(page, "#chart-compare")
    runs = {trace["meta"]["run"] for trace in traces}
    assert runs == {"cmp-r8", "cmp-p8"}
    for run in runs:
        mine = {t["meta"]["metric"]: t for t in traces if t["meta"]["run"] == run}
        assert mine["test/error"]["x"] == [22, 44]
        assert len(mine["train/error"]["x"]) == STEPS // 11
        assert mine["train/error"]["color"] == mine["test/error"]["color"]
    colors = {t["meta"]["run"]: t["color"] for t in traces}
    assert colors["cmp-r8"] != colors["cmp-p8"]
    expect(page.locator("#settings tr[data-key='model.name'] td.diff")).to_have_count(2)
    expect(page.locator("#settings tr[data-key='recipe.batch_size'] td.diff")).to_have_count(0)
    page.check("#only-differences")
    expect(page.locator("#settings tr[data-key='recipe.batch_size']")).to_be_hidden()
    expect(page.locator("#settings tr[data-key='model.name']")).to_be_visible()
    page.uncheck("#only-differences")
    screenshot(page, "compare")


def test_evaluate_button_runs_an_evaluation_that_draws_its_confusion_matrix(
    page: Page, server: Server, worker: WorkerProcess
) -> None:
    source = _submit(server, _spec("eval-source", "resnet8"))
    wait_status(server.settings.database_url, source, "succeeded", timeout=120)
    visit(page, server, f"#/runs/{source}")
    # The button asks for the view: the ten crops of 2015 Tables 2-4.
    page.once("dialog", lambda dialog: dialog.accept("ten_crop"))
    page.click("#actions button[data-action=evaluate]")
    page.wait_for_url("**/#/runs/*")
    expect(page.locator("h1 .status")).to_have_text("succeeded", timeout=120_000)
    page.wait_for_function("document.querySelector('#chart-confusion')?.data?.length === 1")
    [heatmap] = chart_data(page, "#chart-confusion")
    assert heatmap["type"] == "heatmap"
    assert len(heatmap["z"]) == 10
    assert all(len(row) == 10 for row in heatmap["z"])
    assert sum(map(sum, heatmap["z"])) > 300  # digits' seeded 20% test split
    [bars] = chart_data(page, "#chart-per-class")
    assert len(bars["y"]) == 10
    expect(page.locator("#chart-confusion")).to_contain_text("ECE")
    expect(page.locator("#chart-confusion")).to_contain_text("ten_crop view")
    ece = float(page.locator("#ece").inner_text())
    assert 0 <= ece < 0.5
    screenshot(page, "evaluate")


def test_register_alias_and_predict_an_uploaded_digit(
    page: Page, server: Server, worker: WorkerProcess, tmp_path: Path
) -> None:
    source = _submit(server, _spec("to-register", "resnet8"))
    wait_status(server.settings.database_url, source, "succeeded", timeout=120)
    visit(page, server, f"#/runs/{source}")
    page.once("dialog", lambda dialog: dialog.accept("digits-r8"))
    page.click("#actions button[data-action=register]")
    expect(page.locator("[role=status]")).to_contain_text("digits-r8 version 1")

    page.goto(f"{server.url}/#/models")
    card = page.locator("[data-model='digits-r8']")
    expect(card.locator("tbody tr")).to_have_count(1)
    page.once("dialog", lambda dialog: dialog.accept("production"))
    card.locator("button[data-action=alias]").click()
    expect(page.locator("[data-model='digits-r8'] h2")).to_contain_text("production → v1")
    expect(page.locator("[data-model='digits-r8'] tr[data-version='1']")).to_contain_text("resnet8")
    screenshot(page, "models")
    row = card.locator("tr[data-version='1']")
    with page.expect_download(timeout=60_000) as download:
        row.locator("button[data-action=checkpoint]").click()
    with server.client() as client:
        version = client.get("/api/v1/registry/digits-r8").json()["versions"][0]
    assert download.value.suggested_filename == "digits-r8-v1.pt"
    assert hashlib.sha256(download.value.path().read_bytes()).hexdigest() == version["sha256"]
    row.locator("select[name=format]").select_option("torchscript")
    with page.expect_download(timeout=60_000) as download:
        row.locator("button[data-action=export]").click()
    assert download.value.suggested_filename == "digits-r8-v1.torchscript.pt"
    assert torch.jit.load(download.value.path())(torch.zeros(2, 1, 8, 8)).shape == (2, 10)
    expect(row.locator("[data-role=export-status]")).to_contain_text("max |Δp|")
    # More models than a page: the rest come with "more models"; the name filter narrows.
    with server.client() as client:
        for index in range(20):
            body = {"job": str(source)}
            registered = client.post(f"/api/v1/registry/page-{index:02}/versions", json=body)
            assert registered.status_code == 201, registered.text
    page.reload()
    expect(page.locator("#model-cards > .card")).to_have_count(20)
    page.click("#more-models")
    expect(page.locator("#model-cards > .card")).to_have_count(21)
    expect(page.locator("#more-models")).to_have_count(0)
    page.fill("input[name=q]", "digits")
    page.press("input[name=q]", "Enter")
    expect(page.locator("#model-cards > .card")).to_have_count(1)
    expect(page.locator("#model-cards > .card h2")).to_contain_text("digits-r8")

    image, label = _a_digit_the_model_knows(server, tmp_path)
    page.goto(f"{server.url}/#/predict")
    page.fill("input[name=model]", "digits-r8@production")
    page.set_input_files("input[type=file]", str(image))
    result = page.locator(f"#predictions [data-file='{image.name}'] .top-class")
    expect(result).to_have_attribute("data-label", label)
    expect(page.locator("#predictions .pred tbody tr")).to_have_count(5)  # top 5
    expect(page.locator("#served")).to_contain_text("digits-r8 version 1")
    screenshot(page, "predict")


def _a_digit_the_model_knows(server: Server, folder: Path) -> tuple[Path, str]:
    """A test-split digit rendered to PNG that the API classifies right, and its label."""
    test = load_dataset(DigitsSpec(name="digits", validation=0), data_root=folder).test
    assert isinstance(test, TensorSplit)
    with server.client() as client:
        for index in range(10):
            path = folder / f"digit-{index}.png"
            Image.fromarray(test.images[index][0].numpy(), mode="L").save(path)
            with path.open("rb") as data:
                answer = client.post(
                    "/api/v1/predict",
                    params={"model": "digits-r8@production"},
                    files=[("files", (path.name, data, "image/png"))],
                )
            assert answer.status_code == 200, answer.text
            label = str(int(test.labels[index]))
            if answer.json()["results"][0]["top_k"][0]["label"] == label:
                return path, label
    raise AssertionError("the model classified none of the first 10 test digits right")

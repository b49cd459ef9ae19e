"""The job list's filter, declared once (`client.filters.JobFilter`): the service's list
takes exactly its fields as query parameters, and the client sends them as it was given."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from client.filters import JobFilter
from core.settings import Settings


@pytest.fixture(scope="module")
def openapi(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The service's OpenAPI schema (the app is built, never served)."""
    from api.app import create_app

    root: Path = tmp_path_factory.mktemp("filters")
    settings = Settings(
        database_url=f"sqlite:///{root / 'unused.db'}",
        artifact_dir=root / "artifacts",
        data_dir=root / "data",
    )
    schema: dict[str, Any] = create_app(settings).openapi()
    return schema


def _query(openapi: dict[str, Any], path: str) -> set[str]:
    route = openapi["paths"][f"/api/v1{path}"]["get"]
    return {param["name"] for param in route["parameters"] if param["in"] == "query"}


def test_the_job_list_takes_the_filters_fields_and_its_page(openapi: dict[str, Any]) -> None:
    fields = set(JobFilter.model_fields)
    assert _query(openapi, "/jobs") == fields | {"limit", "cursor"}
    assert _query(openapi, "/jobs.csv") == fields | {"columns"}


def test_the_client_sends_what_it_was_given_and_refuses_other_names() -> None:
    study = uuid.uuid4()
    asked = JobFilter.asked({"status": ("failed",), "tag": "a", "filters": ["x<1"], "q": None})
    assert asked.params() == {
        "status": ["failed"],
        "tag": "a",
        "filter": ["x<1"],
        "sort": "-created",
    }
    assert JobFilter.asked({"study": study, "sort": "name"}).params() == {
        "study": str(study),
        "sort": "name",
    }
    with pytest.raises(TypeError, match="not a filter of the job list: colour"):
        JobFilter.asked({"colour": "red"})

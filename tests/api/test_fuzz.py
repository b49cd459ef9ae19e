"""The whole OpenAPI schema fuzzed with Schemathesis against the served API, on Postgres
and on SQLite: no request the schema allows, nor one it does not (NUL and other control
characters in strings, out-of-range numbers, in bodies, paths, queries and headers), makes
the API answer 5xx, and every answer matches the status codes and the body schema its
route documents."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import hypothesis
import pytest
import schemathesis
from hypothesis import HealthCheck
from schemathesis.checks import not_a_server_error
from schemathesis.config import SchemathesisConfig
from schemathesis.specs.openapi.checks import (
    response_schema_conformance,
    status_code_conformance,
)

from api.app import create_app
from core.settings import Settings
from tests.helpers import make_key
from tests.services import serve

CHECKS = [not_a_server_error, status_code_conformance, response_schema_conformance]
# A few examples per operation: enough to reach each route's validation and its 404s, and
# the whole schema (45 operations) in about 40 s per database on two cores.
EXAMPLES = 5
# Strings of any UTF-8 character, NUL and the other control characters included (Postgres
# stores no NUL), in valid and in invalid requests.
# A job spec is the union of every kind's fields: the coverage phase's every case of it
# (each new net's costs counted) took most of the run, so that operation is fuzzed only.
CONFIG = SchemathesisConfig.from_dict(
    {
        "generation": {"mode": "all", "allow-x00": True, "codec": "utf-8"},
        "operations": [
            {
                "include-path": "/api/v1/jobs",
                "include-method": "POST",
                "phases": {"coverage": {"enabled": False}},
            }
        ],
    }
)


@pytest.fixture(scope="module")
def admin_key(database_url: str) -> str:
    """A key with every scope, so that each route runs past its auth check."""
    return make_key(database_url, "admin")


@pytest.fixture(scope="module")
def served(settings: Settings, database_url: str) -> Iterator[str]:
    """The app on the module's database (Postgres, then SQLite) and Redis, served by
    uvicorn: its URL."""
    # Fuzzing sends hundreds of submits a minute; the submit rate limit has tests of its own.
    unlimited = settings.model_copy(
        update={"database_url": database_url, "rate_limit_submits_per_minute": 0}
    )
    with serve(create_app(unlimited)) as url:
        yield url


# The schema as the app declares it (it does not depend on the settings); the requests go
# to the module's served app. A job's event stream stays open until the job ends, so a
# fuzzed request to a live job would wait there, and its events are a text format the
# schema cannot check (tests/api/test_job_data.py follows streams).
schema = schemathesis.openapi.from_dict(create_app(Settings()).openapi(), config=CONFIG).exclude(
    path="/api/v1/jobs/{job_id}/events"
)


@schema.parametrize()
@hypothesis.settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,  # the same requests every run: a failure here is reproducible
    suppress_health_check=list(HealthCheck),
)
def test_no_request_makes_a_5xx_or_an_undocumented_answer(
    case: schemathesis.Case[Any], served: str, admin_key: str
) -> None:
    case.call_and_validate(
        base_url=served,
        headers={"Authorization": f"Bearer {admin_key}"},
        checks=CHECKS,
        timeout=60,
    )

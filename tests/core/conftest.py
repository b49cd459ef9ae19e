"""Fixtures of the core tests."""

from __future__ import annotations

import pytest

from core import keys
from core.db.session import session_scope
from tests.helpers import make_key


@pytest.fixture(scope="module")
def reader(database_url: str) -> keys.Principal:
    """A `read` key of the module's database, authenticated."""
    with session_scope(database_url) as session:
        principal = keys.authenticate(session=session, key=make_key(database_url, "read"))
    assert principal is not None
    return principal

"""CSV text cells: a formula's first characters get a leading quote, other text none."""

from __future__ import annotations

import pytest

from training.spreadsheets import text_cell


@pytest.mark.parametrize("text", ["=1+2", "+1", "-1", "@SUM(1)", "\tx", "\rx"])
def test_a_cell_a_spreadsheet_would_run_is_quoted(text: str) -> None:
    assert text_cell(text) == f"'{text}"


@pytest.mark.parametrize("text", ["", "cat", "1.5", "test/3", "a=b", "'=already"])
def test_other_text_is_as_given(text: str) -> None:
    assert text_cell(text) == text

"""CSV cells that a spreadsheet opens as text, never as a formula.

A cell that starts with `=`, `+`, `-`, `@`, a tab or a carriage return is a formula to
Excel, LibreOffice and Google Sheets (`=HYPERLINK(...)` runs when the file is opened). As
OWASP's CSV injection rule says, such a text cell gets a leading single quote, which the
spreadsheet shows as text; numbers are written as numbers, untouched.
"""

from __future__ import annotations

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def text_cell(text: str) -> str:
    """A text cell as written to CSV: quoted with `'` when a spreadsheet would run it."""
    return f"'{text}" if text.startswith(FORMULA_STARTS) else text

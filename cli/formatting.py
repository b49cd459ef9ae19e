"""How the command line reads its `key=value` options and writes numbers and tables."""

from __future__ import annotations

import json
from typing import Any

import typer
from rich.table import Table


def pairs(items: list[str] | None, what: str) -> dict[str, Any]:
    """`key=value` items to a dict; values are read as JSON when they parse, else as text."""
    result: dict[str, Any] = {}
    for item in items or []:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"expected key=value, got {item!r}", param_hint=what)
        try:
            result[key] = json.loads(raw)
        except json.JSONDecodeError:
            result[key] = raw
    return result


def si(value: int) -> str:
    """1234567 -> '1.23M'."""
    for threshold, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= threshold:
            return f"{value / threshold:.2f}{suffix}"
    return str(value)


def percent(value: float | None) -> str:
    """0.0712 -> '7.12%'; None (not measured) -> '-'."""
    return "-" if value is None else f"{100 * value:.2f}%"


def facts(title: str, *rows: tuple[str, str]) -> Table:
    """A two-column table of labelled values."""
    table = Table(title=title)
    table.add_column("")
    table.add_column("value", justify="right")
    for label, value in rows:
        table.add_row(label, value)
    return table

"""Rollouts from the command line: `alias` (one version, or weights, sticky, a shadow; or
--delete), `promote` and `history`, against a running service over HTTP."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from cli.client import Key, Url, connect
from client.models import Alias

AsJson = Annotated[bool, typer.Option("--json", help="Print the answer as JSON.")]


def parse_weights(versions: list[str]) -> tuple[int | None, dict[int, int] | None]:
    """`3` (one version) or `3=90 4=10` (weights) as (version, weights); exits 2 if neither."""
    if len(versions) == 1 and versions[0].isdigit():
        return int(versions[0]), None
    weights: dict[int, int] = {}
    for item in versions:
        version, equals, weight = item.partition("=")
        if not (equals and version.isdigit() and weight.lstrip("-").isdigit()):
            raise typer.BadParameter(
                f"{item!r}: give one VERSION, or VERSION=WEIGHT for each version (3=90 4=10)"
            )
        weights[int(version)] = int(weight)
    return None, weights


def parse_shadow(shadow: str) -> tuple[int, int]:
    """`5` or `5:PERCENT` as (version, percent)."""
    version, _, percent = shadow.partition(":")
    if not version.isdigit() or not (percent or "100").isdigit():
        raise typer.BadParameter(f"{shadow!r}: give VERSION or VERSION:PERCENT, e.g. 5:20")
    return int(version), int(percent or 100)


def describe(name: str, alias: Alias) -> str:
    """One line of an alias's state: its weights, stickiness and shadow."""
    weights = " ".join(f"{version}={weight}" for version, weight in alias["weights"].items())
    line = f"{name}@{alias['alias']}: {weights}" if len(alias["weights"]) > 1 else (
        f"{name}@{alias['alias']} -> {name}/{alias['version']}"
    )  # fmt: skip
    if alias["sticky"]:
        line += ", sticky"
    shadow = alias["shadow"]
    if shadow is not None:
        line += f", shadow {name}/{shadow['version']} ({shadow['percent']}%)"
    return line


def alias(
    name: Annotated[str, typer.Argument(help="The registered model.")],
    alias_name: Annotated[str, typer.Argument(metavar="ALIAS", help="e.g. production.")],
    versions: Annotated[
        list[str] | None,
        typer.Argument(help="One VERSION, or VERSION=WEIGHT for each version: 3=90 4=10."),
    ] = None,
    sticky: Annotated[
        bool, typer.Option(help="A caller (its key, else X-Session-Key) keeps its version.")
    ] = False,
    shadow: Annotated[
        str | None,
        typer.Option(help="VERSION[:PERCENT]: a version that takes a copy of the requests."),
    ] = None,
    delete: Annotated[bool, typer.Option("--delete", help="Remove the alias.")] = False,
    as_json: AsJson = False,
    url: Url = None,
    key: Key = None,
) -> None:
    """Set an alias's whole state in one request (what is not given is reset), or remove it."""
    if delete:
        with connect(url, key) as client:
            client.delete_alias(name, alias_name)
        typer.echo(f"{name}@{alias_name} removed")
        return
    if not versions:
        raise typer.BadParameter("give a VERSION, or VERSION=WEIGHT pairs, or --delete")
    version, weights = parse_weights(versions)
    copy = parse_shadow(shadow) if shadow is not None else None
    with connect(url, key) as client:
        state = client.set_alias(
            name,
            alias_name,
            version,
            weights=weights,
            sticky=sticky,
            shadow=copy[0] if copy else None,
            shadow_percent=copy[1] if copy else 100,
        )
    typer.echo(json.dumps(state, indent=2) if as_json else describe(name, state))


def promote(
    name: Annotated[str, typer.Argument(help="The registered model.")],
    alias_name: Annotated[str, typer.Argument(metavar="ALIAS", help="e.g. production.")],
    version: Annotated[int, typer.Argument(help="One of the alias's versions or its shadow.")],
    as_json: AsJson = False,
    url: Url = None,
    key: Key = None,
) -> None:
    """Serve VERSION alone through the alias (its weights and shadow cleared)."""
    with connect(url, key) as client:
        state = client.promote(name, alias_name, version)
    typer.echo(json.dumps(state, indent=2) if as_json else describe(name, state))


def history(
    name: Annotated[str, typer.Argument(help="The registered model.")],
    limit: Annotated[int, typer.Option(help="The newest this many changes.")] = 50,
    as_json: AsJson = False,
    url: Url = None,
    key: Key = None,
) -> None:
    """The model's registry changes, newest first: when, who, what, before -> after."""
    with connect(url, key) as client:
        entries = client.history(name, limit=limit)
    if as_json:
        typer.echo(json.dumps(entries, indent=2))
        return
    for entry in entries:
        who = entry["key_name"] or entry["key_id"] or "-"
        what = entry["action"] + (f" {entry['alias']}" if entry["alias"] else "")
        what += f" v{entry['version']}" if entry["version"] is not None else ""
        change = ""
        if entry["before"] is not None or entry["after"] is not None:
            change = f"  {_brief(entry['before'])} -> {_brief(entry['after'])}"
        typer.echo(f"{entry['at'][:19]}  {who}  {what}{change}")


def _brief(state: dict[str, object] | None) -> str:
    """A history state in a few characters: weights, sticky, shadow."""
    if state is None:
        return "-"
    weights = state.get("weights")
    text = (
        " ".join(f"{v}={w}" for v, w in weights.items())
        if isinstance(weights, dict)
        else json.dumps(state, sort_keys=True)
    )
    shadow = state.get("shadow")
    if isinstance(shadow, dict):
        text += f" shadow {shadow['version']}:{shadow['percent']}"
    return text + (" sticky" if state.get("sticky") else "")

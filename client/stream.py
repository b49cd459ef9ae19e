"""Server-Sent Events, as a job's event stream sends them."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator

from client.models import Event


def parse_sse(lines: Iterable[str]) -> Iterator[Event]:
    """Each event of a stream's lines (comments and keep-alives skipped)."""
    fields: dict[str, str] = {}
    for line in lines:
        if line:
            name, _, value = line.partition(":")
            if name:  # a line starting with ":" is a comment
                fields[name] = value.removeprefix(" ")
            continue
        if "event" in fields:
            data = json.loads(fields.get("data", "null"))
            yield Event(fields["event"], data if isinstance(data, dict) else {}, fields.get("id"))
        fields = {}

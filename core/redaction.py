"""Text for clients without the server's paths: files under the service's roots relative to
them, any other absolute path shortened to its last part."""

from __future__ import annotations

import re
from pathlib import Path

from core.settings import Settings

# An absolute POSIX path: a slash that starts a word (not inside a URL, a unit such as
# images/s or a relative path), then name characters and slashes.
_ABSOLUTE = re.compile(r"(?<![\w.:/~\\-])/[^\s'\"`,;:()\[\]{}<>\\]*")
URL_PATHS = ("/api/", "/docs", "/openapi.json")  # the service's own routes, not files


def roots(settings: Settings) -> dict[str, str]:
    """The service's roots as clients may know them, by their absolute path on this server."""
    named = {"ARTIFACT_DIR": settings.artifact_dir, "DATA_DIR": settings.data_dir}
    found: dict[str, str] = {}
    for name, root in named.items():
        for form in {str(root), str(root.resolve())}:
            if form.startswith("/") and form != "/":
                found[form.rstrip("/")] = name
    return found


def public_text(text: str, settings: Settings) -> str:
    """`text` with every absolute path made relative to its root, or cut to its last part."""
    known = roots(settings)
    return _ABSOLUTE.sub(lambda match: _public_path(match.group(), known), text)


def _public_path(path: str, known: dict[str, str]) -> str:
    if path.startswith(URL_PATHS):
        return path
    # The longest root first: DATA_DIR may lie inside ARTIFACT_DIR's parent, or the reverse.
    for root in sorted(known, key=len, reverse=True):
        if path.rstrip("/") == root:
            return known[root]
        if path.startswith(root + "/"):
            return path[len(root) + 1 :]
    name = Path(path).name
    return name if name else path

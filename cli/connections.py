"""How the HTTP server that faces clients treats connections: which proxies' forwarded
headers it trusts, how long request headers may take, how many connections it holds.

uvicorn closes idle keep-alive connections but waits for a request's headers without
end, so a client that sends half its headers holds a connection (and a file descriptor)
for as long as it likes; `HeaderTimeout` closes it.
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from core.settings import Settings

KEEP_ALIVE_S = 5  # uvicorn's default: an idle connection between requests is closed


class HeaderTimeout(HttpToolsProtocol):
    """uvicorn's HTTP/1.1 protocol, closing a connection whose request headers are not all
    in within `header_timeout_s` of its first byte (or of the connection, for the first)."""

    header_timeout_s: ClassVar[float] = 10.0
    header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self.header_timer is None:  # the first request's timer runs from the connection
            self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self.header_timer = self.loop.call_later(self.header_timeout_s, self._headers_late)

    def _disarm(self) -> None:
        if self.header_timer is not None:
            self.header_timer.cancel()
            self.header_timer = None

    def _headers_late(self) -> None:
        self.header_timer = None
        if not self.transport.is_closing():
            self.transport.close()


def server_options(settings: Settings) -> dict[str, Any]:
    """uvicorn's options for the API process, from `settings`."""
    trusted = settings.forwarded_allow_ips.strip()
    return {
        "http": type(
            "HeaderTimeout", (HeaderTimeout,), {"header_timeout_s": settings.header_timeout_seconds}
        ),
        # Off by default: uvicorn would otherwise take X-Forwarded-For from any loopback
        # caller, who could then pick the address its per-caller limits count.
        "proxy_headers": bool(trusted),
        "forwarded_allow_ips": trusted or None,
        "limit_concurrency": settings.max_connections,
        "timeout_keep_alive": KEEP_ALIVE_S,
    }

"""Connection limits for uvicorn's h11 protocol (issue 42): a cap on open connections and a
deadline for a new connection's request headers.

uvicorn's own settings cover what they can: `limit_concurrency` (503 past that many connections
or tasks), `timeout_keep_alive` (idle keep-alive connections), `h11_max_incomplete_event_size`
(header bytes). It has no header timeout, so a client that opens a connection and sends its
headers a byte at a time (slowloris) held it forever, and thousands of them were bounded only by
the file-descriptor limit. This protocol closes a connection whose first request's headers have
not arrived within `header_timeout_s` (a later request's on a kept-alive connection from its
first byte), and closes at once a connection past `max_connections`.
"""

from __future__ import annotations

import logging

from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger(__name__)


def limited_protocol(header_timeout_s: float, max_connections: int) -> type[H11Protocol]:
    """An H11Protocol class with these limits (uvicorn.Config(http=...) takes a class)."""

    class LimitedH11Protocol(H11Protocol):
        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._header_timer = None
            if len(self.connections) > max_connections:
                log.warning("connection from %s refused: %d connections open (the limit is %d)",
                            _peer(self.client), len(self.connections) - 1, max_connections)
                transport.close()
                return
            self._arm()

        def data_received(self, data: bytes) -> None:
            # The first bytes of a later request on a kept-alive connection start its deadline too
            # (uvicorn's keep-alive timer stops at the first byte).
            if self._header_timer is None and self.cycle is not None and self.cycle.response_complete:
                self._arm()
            super().data_received(data)

        def handle_events(self) -> None:
            super().handle_events()
            if self._header_timer is not None and self.cycle is not self._timed_cycle:  # headers arrived
                self._disarm()

        def connection_lost(self, exc) -> None:
            if getattr(self, "_header_timer", None) is not None:
                self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._timed_cycle = self.cycle  # the request before the one whose headers are awaited
            self._header_timer = self.loop.call_later(header_timeout_s, self._headers_late)

        def _disarm(self) -> None:
            self._header_timer.cancel()
            self._header_timer = None

        def _headers_late(self) -> None:
            self._header_timer = None
            if self.cycle is self._timed_cycle and not self.transport.is_closing():
                log.info("connection from %s closed: no request headers within %g s", _peer(self.client),
                         header_timeout_s)
                self.transport.close()

    return LimitedH11Protocol


def _peer(client) -> str:
    return "%s:%d" % client if client else "unknown"

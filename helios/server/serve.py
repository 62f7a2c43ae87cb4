"""Running the app under uvicorn: the ready line, and SIGTERM/SIGINT as a bounded drain."""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import signal
import sys
import threading
import time

import uvicorn

from helios.server import request_log
from helios.server.app import ServerSettings, create_app
from helios.server.backend import Backend
from helios.server.connections import limited_protocol
from helios.server.hardening_cli import exposure_warning


class _Server(uvicorn.Server):
    """uvicorn.Server whose first signal drains the runtime before the listener closes.

    uvicorn alone would close the listening socket at once and wait for open streams without
    bound, then re-raise the signal (exit status 143). Here the first SIGTERM/SIGINT makes the
    app answer 503, lets in-flight requests finish for the grace period, cancels the rest
    (their slots and pages come back through the fence rules), and then exits with status 0.
    A second signal exits at once (status 1) without tracebacks.
    """

    def __init__(self, config: uvicorn.Config, service):
        super().__init__(config)
        self.service = service
        self._draining = False
        self._drain_start = 0.0

    @contextlib.contextmanager
    def capture_signals(self):
        # serve() installs handle_exit for the whole run, before uvicorn starts; uvicorn's own
        # capture would re-raise the signal on exit.
        yield

    def handle_exit(self, sig, frame) -> None:
        if self._draining:
            exit_now()
        self._draining = True
        self.service.draining = True
        self._drain_start = time.monotonic()
        live, grace = self.service.live, self.service.settings.shutdown_grace_s
        print(f"flare: {signal.Signals(sig).name}: draining {live} request{'s' * (live != 1)} for up to "
              f"{grace:g} s (new requests get 503); a second signal exits at once", file=sys.stderr, flush=True)
        threading.Thread(target=self._drain, name="flare-drain", daemon=True).start()

    def _drain(self) -> None:
        try:
            self.service.drain()
        finally:
            print(f"flare: drained in {time.monotonic() - self._drain_start:.1f} s; exiting", file=sys.stderr,
                  flush=True)
            self.should_exit = True


def exit_now() -> None:
    """The second signal: stop at once and quietly. Unwinding the event loop from here would cancel
    every open connection's task and print their CancelledError tracebacks, so the process ends
    without unwinding; spawned tensor-parallel ranks are terminated first, so none outlives it."""
    print("flare: second signal: exiting now", file=sys.stderr, flush=True)
    for child in multiprocessing.active_children():
        child.terminate()
    sys.stderr.flush()
    os._exit(1)


def serve(backend: Backend, settings: ServerSettings, host: str, port: int, *, log_level: str = "warning",
          status_every_s: float = request_log.STATUS_EVERY_S) -> int:
    """Serve until SIGTERM/SIGINT; print one line when ready. Returns the exit status."""
    app = create_app(backend, settings)
    if (warning := exposure_warning(host, settings.api_key)) is not None:
        print(warning, file=sys.stderr, flush=True)
    config = uvicorn_config(app, settings, host, port, log_level)
    service = app.state.service
    request_log.configure(log_level)
    service.runtime.on_finish = request_log.chain(service.runtime.on_finish, request_log.log_request)
    server = _Server(config, service)
    signals = (signal.SIGINT, signal.SIGTERM)
    previous = {sig: signal.signal(sig, server.handle_exit) for sig in signals}
    status = request_log.StatusReporter(service.runtime, status_every_s)
    try:
        return asyncio.run(_run(server, backend.model_id, status))
    except KeyboardInterrupt:  # a signal before uvicorn installed its handlers
        return 0
    except SystemExit as exc:  # uvicorn exits this way when it cannot bind or start
        print(f"flare run: error: the server could not start on {host}:{port}", file=sys.stderr)
        return int(exc.code or 1) if isinstance(exc.code, int) else 1
    finally:
        status.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def uvicorn_config(app, settings: ServerSettings, host: str, port: int, log_level: str = "warning") -> uvicorn.Config:
    """uvicorn's settings for the app: connection cap, header and keep-alive timeouts."""
    return uvicorn.Config(app, host=host, port=port, log_level=log_level, 
                          # uvicorn's access log only at debug: at info, the request lines say more per request.
                          access_log=log_level == "debug", lifespan="on",
                          timeout_graceful_shutdown=5, timeout_keep_alive=5,
                          # uvicorn answers 503 from this many connections or tasks on (>=); the
                          # protocol closes connections past max_connections before that.
                          limit_concurrency=settings.max_connections + 1,
                          http=limited_protocol(settings.header_timeout_s, settings.max_connections))


async def _run(server: _Server, model_id: str, status) -> int:
    task = asyncio.create_task(server.serve())
    while not server.started and not task.done():
        await asyncio.sleep(0.05)
    if server.started:
        host, port = server.servers[0].sockets[0].getsockname()[:2]
        shown = f"[{host}]" if ":" in host else host
        print(f"flare: serving {model_id} on http://{shown}:{port}", flush=True)
        status.start()
    await task
    if not server.started:
        print("flare run: error: the server did not start (see the message above)", file=sys.stderr)
        return 1
    return 0

"""The scheduler explains itself: /debug/decisions (JSON and SSE), /debug/stats and /dashboard.

- GET /debug/decisions?since=SEQ&limit=N: the decision log (helios.runtime.decisions) after SEQ;
  poll with the returned `last` as the next `since`.
- GET /debug/decisions/stream?since=SEQ: the same decisions as server-sent events, one `decision`
  event per decision with `id:` its sequence number (a reconnecting client's Last-Event-ID resumes).
- GET /debug/stats: one sample for the dashboard (counters, slots, queue, recent latency percentiles,
  graph counters as /metrics counts them).
- GET /dashboard: the page (helios/server/dashboard/), plain HTML and JavaScript, and its assets.

With --api-key, every /debug route needs the bearer token (helios.server.guards checks /v1/ and
/debug/ alike); the dashboard page itself holds no data and asks for the key in the browser when the
server answers 401.
"""

from __future__ import annotations

import asyncio
import json
import time
from importlib import resources

from fastapi import APIRouter, FastAPI, Query, Request
from fastapi.responses import FileResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool

from helios.server.errors import APIError

POLL_S = 0.25  # the SSE stream looks for new decisions this often
KEEPALIVE_POLLS = 40  # a comment line after this many quiet polls (10 s)
MAX_READ = 1024  # decisions in one JSON answer or one SSE batch
_ASSETS = {"uPlot.iife.min.js": "text/javascript", "uPlot.min.css": "text/css", "dashboard.js": "text/javascript",
           "dashboard.css": "text/css", "LICENSE-uPlot": "text/plain"}


def _log(service):
    log = service.runtime.decisions
    if log is None:
        raise APIError(404, "this server keeps no decision log", code="not_found")
    return log


def decisions_body(log, since: int, limit: int) -> dict:
    items = log.since(since, limit)
    # `last` is the newest decision in this answer, not the log's: the step thread may record one
    # between the two reads, and a client polling with `since=last` would never see it.
    last = items[-1]["seq"] if items else since
    return {"object": "list", "last": last, "recorded": log.recorded, "capacity": log.maxlen,
            "since": since, "data": items}


def stats_body(service) -> dict:
    snap, stats = service.runtime.snapshot()
    log = service.runtime.decisions
    origin = log.origin_ns if log is not None else 0
    # The server's runtime runs on time.monotonic_ns; the scheduler's own time moves only with decisions.
    now = time.monotonic_ns()
    return {"t": (now - origin) / 1e9, "output_tokens": stats.generated_tokens,
            "submitted": stats.submitted, "finished": sum(stats.finished.values()),
            "running": snap.running, "waiting": snap.waiting, "free_slots": snap.free_slots,
            "slots": snap.total_slots, "free_pages": snap.free_pages, "pages": snap.total_pages,
            "queued_frames": snap.queued_frames,
            "graphs": {sh.label(): n for sh, n in sorted(snap.by_shape.items(), key=lambda kv: kv[0].label())},
            "decisions": {"last": log.last if log else 0, "recorded": log.recorded if log else 0},
            "latency": service.live_stats.summary(now)}


def router(service) -> APIRouter:
    guarded = APIRouter()

    @guarded.get("/debug/decisions")
    async def decisions(since: int = Query(0, ge=0), limit: int = Query(MAX_READ, ge=1, le=MAX_READ)):
        return await run_in_threadpool(decisions_body, _log(service), since, limit)

    # An endless event stream is no operation a generated client (or the schema fuzz) can call to
    # completion, so it stays out of /openapi.json; docs/server.md documents it.
    @guarded.get("/debug/decisions/stream", include_in_schema=False)
    async def decision_stream(request: Request, since: int | None = Query(None, ge=0)):
        log = _log(service)
        resume = request.headers.get("last-event-id", "")
        start = since if since is not None else int(resume) if resume.isdigit() else log.last
        return StreamingResponse(_events(request, service, log, start), media_type="text/event-stream",
                                 headers={"cache-control": "no-cache", "x-accel-buffering": "no"})

    @guarded.get("/debug/stats")
    async def debug_stats():
        return await run_in_threadpool(stats_body, service)

    return guarded


async def _events(request: Request, service, log, seq: int):
    yield "retry: 1000\n\n"
    quiet = 0
    while not service.draining:
        if log.last > seq:
            quiet = 0
            for d in await run_in_threadpool(log.since, seq, MAX_READ):
                seq = d["seq"]
                yield f"event: decision\nid: {seq}\ndata: {json.dumps(d)}\n\n"
        elif (quiet := quiet + 1) % KEEPALIVE_POLLS == 0:
            yield ": idle\n\n"  # a comment keeps proxies from closing a quiet stream
        if await request.is_disconnected():
            return
        await asyncio.sleep(POLL_S)


def _asset(name: str):
    return resources.files("helios.server.dashboard").joinpath(name)


def install_debug(app: FastAPI, service) -> None:
    """Add the debug routes and the dashboard to `app` (the page and its assets need no key)."""
    app.include_router(router(service))

    @app.get("/dashboard", include_in_schema=False)
    async def dashboard():
        return FileResponse(str(_asset("index.html")), media_type="text/html")

    @app.get("/dashboard/{name}", include_in_schema=False)
    async def dashboard_asset(name: str):
        if name not in _ASSETS:
            raise APIError(404, f"no dashboard asset {name!r}")
        return FileResponse(str(_asset(name)), media_type=_ASSETS[name])

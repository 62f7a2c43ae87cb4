"""What every request passes before its body is read (issue 42): the API key, the content type,
CORS, and a body read bounded in size and time; and the reason label under which a refusal is
counted in flare_requests_rejected_total.

- `--api-key` (or FLARE_API_KEY, read by the CLI): every /v1/* request needs
  `Authorization: Bearer KEY` (401 otherwise), as vLLM's --api-key / VLLM_API_KEY do. /health and
  /metrics stay open, as in vLLM, for load balancers and scrapers.
- POST bodies must be `application/json` (415 otherwise). A web page can send text/plain to any
  server without a CORS preflight, so without this check any page a user opens could drive a
  local server.
- `--allowed-origins`: CORS for browser clients (FastAPI's CORSMiddleware); none by default.
- The body must arrive within `body_timeout_s` (408) and within `max_body_bytes` (413); a client
  that leaves mid-upload is logged in one line.
"""

from __future__ import annotations

import asyncio
import hmac
import logging

from fastapi import Depends, FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect

from helios.server.errors import APIError

log = logging.getLogger(__name__)

# flare_requests_rejected_total{reason}: error codes that name their own reason, else the status.
_REASONS = {"shutting_down": "draining", "queue_full": "queue_full", "client_share_full": "client_share",
            "context_length_exceeded": "too_long", "body_too_large": "too_large"}
_STATUS_REASONS = {400: "invalid", 401: "unauthorized", 404: "not_found", 405: "method_not_allowed",
                   408: "timeout", 413: "too_large", 415: "unsupported_media_type", 422: "invalid",
                   429: "queue_full", 499: "client_disconnected", 503: "draining"}


def rejection_reason(status: int, code: str | None) -> str | None:
    """The `reason` label of a refused request; None for an error that is not a refusal (a 500
    or 503 for a request that was admitted and then failed or was cancelled by shutdown)."""
    if status >= 500 and code != "shutting_down":
        return None
    return _REASONS.get(code or "", _STATUS_REASONS.get(status, str(status)))


def count_rejection(metrics, status: int, code: str | None) -> None:
    """flare_requests_rejected_total{reason} += 1 for a refusal."""
    if (reason := rejection_reason(status, code)) is not None:
        metrics.rejected.labels(reason).inc()


GUARDED_PREFIXES = ("/v1/", "/debug/")


def install_guards(app: FastAPI, settings) -> None:
    """Authentication and content type as an app-wide dependency (so that refusals take the
    OpenAI error shape and are counted), and CORS when origins are allowed. Call it before the
    routes are declared."""
    key = settings.api_key.encode() if settings.api_key else None

    async def guard(request: Request):
        # The API and the decision log (which names requests and their prices) need the key; the
        # dashboard page itself holds no data, and /health and /metrics stay open as in vLLM.
        if key is not None and request.url.path.startswith(GUARDED_PREFIXES):
            scheme, _, token = request.headers.get("authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), key):
                raise APIError(401, "Incorrect or missing API key: send it as 'Authorization: Bearer KEY'",
                               code="invalid_api_key", headers={"www-authenticate": "Bearer"})
        if request.method == "POST":
            kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
            if kind != "application/json":
                raise APIError(415, f"the request body must be JSON sent as 'Content-Type: application/json', "
                                    f"got {kind or 'no content type'!r}", code="unsupported_media_type")

    app.router.dependencies.append(Depends(guard))
    if settings.allowed_origins:
        app.add_middleware(CORSMiddleware, allow_origins=list(settings.allowed_origins),
                           allow_methods=["GET", "POST", "OPTIONS"], allow_headers=["authorization", "content-type"])


async def read_body(request: Request, settings) -> bytes:
    """The request body, within `max_body_bytes` (413) and `body_timeout_s` (408)."""
    limit = settings.max_body_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise APIError(413, f"the request body is {declared} bytes; the limit is {limit}", code="body_too_large")
    chunks, size = [], 0

    async def receive():
        nonlocal size
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:  # chunked bodies carry no content-length
                raise APIError(413, f"the request body exceeds the limit of {limit} bytes", code="body_too_large")
            chunks.append(chunk)

    try:
        await asyncio.wait_for(receive(), settings.body_timeout_s)
    except asyncio.TimeoutError:
        log.info("request body from %s not received within %g s (%d bytes)", _peer(request),
                 settings.body_timeout_s, size)
        raise APIError(408, f"the request body did not arrive within {settings.body_timeout_s:g} s",
                       code="body_timeout", headers={"connection": "close"}) from None
    except ClientDisconnect:
        log.info("client %s disconnected during its upload (%d bytes received)", _peer(request), size)
        raise APIError(499, "the client disconnected during its upload", code="client_disconnected") from None
    return b"".join(chunks)


def _peer(request: Request) -> str:
    return f"{request.client.host}:{request.client.port}" if request.client else "unknown"

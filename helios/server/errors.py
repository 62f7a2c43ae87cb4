"""OpenAI-shaped errors: {"error": {"message", "type", "param", "code"}} for every failure."""

from __future__ import annotations

import logging
from typing import Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger(__name__)

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
          405: "invalid_request_error", 408: "invalid_request_error", 413: "invalid_request_error",
          415: "invalid_request_error", 429: "rate_limit_error",
          500: "server_error", 503: "server_error"}


class APIError(Exception):
    """An error answered to the client with `status` and OpenAI's error body."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers

    @property
    def type(self) -> str:
        return _TYPES.get(self.status, "invalid_request_error" if self.status < 500 else "server_error")

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def install_handlers(app: FastAPI, on_error: Callable[[int, str | None], None] | None = None) -> None:
    """Route every error path (ours, routing, FastAPI validation, crashes) to the OpenAI shape;
    `on_error(status, code)` sees every refusal (not a crash)."""
    count = on_error or (lambda status, code: None)

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        count(exc.status, exc.code)
        return exc.response()

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        message = {404: f"no route for {request.method} {request.url.path}",
                   405: f"method {request.method} is not allowed on {request.url.path}"}
        text = message.get(exc.status_code, str(exc.detail))
        count(exc.status_code, None)
        return APIError(exc.status_code, text, code=None, headers=getattr(exc, "headers", None)).response()

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        count(400, None)
        return APIError(400, f"invalid request: {exc.errors()[0].get('msg')}").response()

    @app.exception_handler(Exception)
    async def _crash(request: Request, exc: Exception):
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return APIError(500, f"internal server error: {type(exc).__name__}", code="internal_error").response()

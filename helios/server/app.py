"""The OpenAI-compatible HTTP app: routes, admission, streaming and cancellation."""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from helios.engine.grammar import GRAMMAR_OPTION
from helios.runtime.runtime import Runtime, RuntimeClosed
from helios.runtime.stream import RequestStream
from helios.errors import InvalidRequest
from helios.server.backend import Backend
from helios.server.admission import Admission, client_key
from helios.server.constraint_limits import LIMITS, compile_for_core
from helios.server.debug import install_debug
from helios.server.live_stats import LiveStats
from helios.server.errors import APIError, install_handlers
from helios.server import tokenize
from helios.server.guards import count_rejection, install_guards, read_body
from helios.server.limits import check_prompt_size, longest_token_bytes
from helios.server.logprobs import LogprobsFormatter
from helios.server.metrics import CONTENT_TYPE, ServerMetrics
from helios.server.schemas import ChatCompletionRequest, CompletionRequest, parse_body
from helios.server.responses import Choices, collect, events
from helios.server.sse import EventStreamResponse, Formatter
from helios.server.service_classes import ClassPolicy, request_class, with_class
from helios.server.structured_outputs import constraint_source, grammar_param
from helios.server.translate import Prepared, prepare_chat, prepare_completion


@dataclass(frozen=True, slots=True)
class ServerSettings:
    """HTTP-side limits: admission queue, body size, shutdown grace."""

    max_queue: int = 32  # requests admitted beyond the request slots before answering 429
    max_body_bytes: int = 2 * 1024 * 1024
    shutdown_grace_s: float = 5.0  # in-flight requests may finish for this long on shutdown
    # Hardening (issue 42): fair admission, authentication, CORS, body read timeout.
    client_share: float = 0.5  # one client holds at most this fraction of the admission limit
    api_key: str | None = None  # Bearer token required on /v1/* and /debug/* (None: open)
    allowed_origins: tuple[str, ...] = ()  # CORS origins ("*" for any); none: no CORS headers
    body_timeout_s: float = 30.0  # the whole request body must arrive within this
    header_timeout_s: float = 10.0  # a new connection's request headers must arrive within this
    max_connections: int = 1000  # open connections (helios.server.connections)
    classes: ClassPolicy = field(default_factory=ClassPolicy)  # service classes (--service-classes, --class-field)

    def __post_init__(self):
        if not 0 < self.client_share <= 1:
            raise ValueError(f"client_share must be in (0, 1], got {self.client_share}")
        if self.api_key is not None and not self.api_key:
            raise ValueError("api_key must not be empty")


class Service:
    """One served model: the runtime, its admission bound, metrics and drain state."""

    def __init__(self, backend: Backend, settings: ServerSettings):
        self.backend = backend
        self.settings = settings
        self.metrics = ServerMetrics()
        self.live_stats = LiveStats()  # recent latencies for /debug/stats and the dashboard
        self.runtime = Runtime(backend.scheduler, backend.core, tokenizer=backend.tokenizer,
                               on_finish=self._on_finish)
        self.metrics.attach(self.runtime)
        self.limit = backend.slots + settings.max_queue
        self.admission = Admission(self.limit, settings.client_share)  # submitted, not yet ended
        self.longest_token = longest_token_bytes(backend.tokenizer)
        self.draining = False
        self.created = int(time.time())
        self._owner: dict[str, str | None] = {}  # runtime request id -> its client (admission)
        self._lock = threading.Lock()

    @property
    def live(self) -> int:
        return self.admission.live

    def start(self) -> None:
        if not self.draining:  # a signal may arrive before the app has started
            self.runtime.start()

    def drain(self) -> bool:
        """Stop admitting (new requests get 503), let in-flight requests finish within the grace
        period, cancel the rest, and stop the runtime. Safe to call more than once."""
        self.draining = True
        grace = self.settings.shutdown_grace_s
        return self.runtime.stop(timeout=grace + 30.0, drain_s=grace)

    def _on_finish(self, stream: RequestStream) -> None:
        with self._lock:
            self.admission.release(self._owner.pop(stream.request_id, None))
        self.metrics.observe(stream)
        self.live_stats.observe(stream)

    def check_admission(self, sequences: int = 1, client: str | None = None) -> None:
        """Refuse a request whose `sequences` (its choices) the admission bound, or its client's
        share of it (helios.server.admission), cannot take now. Every refusal is counted in
        flare_requests_rejected_total by the error handler."""
        if self.draining:
            raise APIError(503, "the server is shutting down and admits no new requests", code="shutting_down")
        self.admission.check(client, sequences)

    def submit(self, prepared: Prepared, chat: bool = False, client: str | None = None) -> Choices:
        """Submit every choice, or none: a choice that cannot be submitted cancels those that were."""
        with self._lock:
            self.check_admission(len(prepared.choices), client)
            self.admission.take(client, len(prepared.choices))
            self._owner.update((c.params.request_id, client) for c in prepared.choices)
        streams: list[RequestStream] = []
        try:
            for choice in prepared.choices:
                streams.append(self.runtime.submit(choice.prompt_ids, choice.params))
        except (InvalidRequest, RuntimeClosed) as exc:
            with self._lock:  # a submitted stream is released when it ends
                for choice in prepared.choices[len(streams):]:
                    self.admission.release(self._owner.pop(choice.params.request_id, None))
            for stream in streams:
                stream.cancel()
            if isinstance(exc, RuntimeClosed):
                raise APIError(503, "the server is shutting down and admits no new requests",
                               code="shutting_down") from None
            raise APIError(400, str(exc), code="invalid_value") from None
        wants = any(c.params.logprobs is not None for c in prepared.choices)
        return Choices(prepared, streams, LogprobsFormatter(self.backend.tokenizer, chat) if wants else None)


def create_app(backend: Backend, settings: ServerSettings | None = None) -> FastAPI:
    """The FastAPI app; its lifespan starts the runtime and drains it on shutdown."""
    service = Service(backend, settings or ServerSettings())

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        service.start()
        try:
            yield
        finally:
            await run_in_threadpool(service.drain)

    app = FastAPI(title="flare", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.service = service
    install_handlers(app, on_error=lambda status, code: count_rejection(service.metrics, status, code))
    install_guards(app, settings or ServerSettings())

    @app.get("/health")
    async def health():
        if service.draining:
            return JSONResponse({"status": "draining"}, status_code=503)
        if service.runtime.error is not None:
            return JSONResponse({"status": "failed", "error": str(service.runtime.error)}, status_code=503)
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics():
        body = await run_in_threadpool(service.metrics.render)
        return Response(body, media_type=CONTENT_TYPE)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [_model_card(name, service) for name in backend.names]}

    @app.get("/v1/models/{name:path}")
    async def model(name: str):
        _check_model(name, backend)
        return _model_card(name, service)

    @app.post("/v1/completions")
    async def completions(request: Request):
        req = await run_in_threadpool(parse_body, CompletionRequest, await read_body(request, service.settings))
        return await _serve(request, service, req, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        req = await run_in_threadpool(parse_body, ChatCompletionRequest, await read_body(request, service.settings))
        return await _serve(request, service, req, chat=True)

    install_debug(app, service)  # /debug/decisions (+ stream), /debug/stats, /dashboard
    tokenize.install(app, service, read_body, _check_model)  # /tokenize, /detokenize, /version
    app.openapi = lambda: _openapi(app)
    return app


def _openapi(app: FastAPI) -> dict:
    """FastAPI's schema, plus the JSON bodies the two POST routes parse themselves (to answer
    every bad body in OpenAI's error shape), so clients and schema-driven fuzzing see them."""
    if app.openapi_schema is None:
        schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for path, model in (("/v1/completions", CompletionRequest), ("/v1/chat/completions", ChatCompletionRequest),
                            *tokenize.BODIES):
            body = model.model_json_schema(ref_template="#/components/schemas/{model}")
            components.update(body.pop("$defs", {}))
            components[model.__name__] = body
            schema["paths"][path]["post"]["requestBody"] = {"required": True, "content": {"application/json": {
                "schema": {"$ref": f"#/components/schemas/{model.__name__}"}}}}
        app.openapi_schema = schema
    return app.openapi_schema


def _model_card(model_id: str, service: Service) -> dict:
    return {"id": model_id, "object": "model", "created": service.created, "owned_by": "helios",
            "max_model_len": service.backend.max_context}


def _check_model(name: str | None, backend: Backend) -> None:
    if name is not None and name not in backend.names:
        served = "', '".join(backend.names)
        raise APIError(404, f"The model '{name}' does not exist; this server serves '{served}'", param="model",
                       code="model_not_found")


async def _serve(request: Request, service: Service, req, chat: bool):
    backend = service.backend
    _check_model(req.model, backend)
    client = client_key(req.user, request.client.host if request.client else None)
    service.check_admission(1, client)  # cheap early refusals before tokenizing
    check_prompt_size(req, chat, backend.max_context, service.longest_token)
    classed = request_class(req, service.settings.classes)  # an unknown class: 400 before tokenizing
    if chat:
        prepared = await run_in_threadpool(prepare_chat, req, backend.tokenizer, backend.max_context,
                                           backend.vocab_size)
    else:
        prepared = await run_in_threadpool(prepare_completion, req, backend.tokenizer, backend.max_context,
                                           backend.vocab_size)
    if not getattr(backend.core, "grammars", False) and any(
            GRAMMAR_OPTION in c.params.core_options for c in prepared.choices):
        param = grammar_param(req)
        raise APIError(400, f"{param} needs the torch engine on one rank (this server's core cannot "
                            "constrain its output)", param=param, code="unsupported_parameter")
    if getattr(backend.core, "grammars", False):  # compiled and probed here, not on the engine's thread
        prepared = await run_in_threadpool(compile_for_core, prepared, backend.core, grammar_param(req), LIMITS,
                                           constraint_source(req))
    # The scheduler's client (its tenant, its slot share) is the unit of fair admission.
    choices = service.submit(with_class(prepared, {**classed, "client": client}), chat, client)
    fmt = Formatter(chat, backend.model_id, prepared.request_id, prepared.include_usage,
                    prepared.continuous_usage)
    draining = lambda: service.draining  # noqa: E731
    if prepared.stream:
        return EventStreamResponse(events(choices, fmt, draining), choices.cancel, choices.cancel)
    return await collect(request, choices, fmt, draining)

"""`flare run`: an OpenAI-compatible HTTP server (SSE streaming, Prometheus metrics) on Helios.

    backend = build_backend(EngineOptions())          # the embedded SmolLM2 under Helios balanced
    app = create_app(backend, ServerSettings())       # a FastAPI app; its lifespan runs the runtime
    serve(backend, ServerSettings(), "127.0.0.1", 8000)
"""

from helios.server.app import ServerSettings, Service, create_app
from helios.server.backend import Backend, EngineOptions, build_backend
from helios.server.errors import APIError
from helios.server.serve import serve

__all__ = ["APIError", "Backend", "EngineOptions", "ServerSettings", "Service", "build_backend", "create_app",
           "serve"]

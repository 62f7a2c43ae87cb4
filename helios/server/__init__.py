"""`flare run`: an OpenAI-compatible HTTP server (SSE streaming, Prometheus metrics) on Helios.

    backend = build_backend(EngineOptions())          # the embedded SmolLM2 under Helios balanced
    app = create_app(backend, ServerSettings())       # a FastAPI app; its lifespan runs the runtime
    serve(backend, ServerSettings(), "127.0.0.1", 8000)

The names are imported on first use (PEP 562), so `flare --help`, which reads only the flags in
helios.server.command, does not import FastAPI, uvicorn or torch.
"""

import importlib

_EXPORTS = {"ServerSettings": "app", "Service": "app", "create_app": "app", "Backend": "backend",
            "EngineOptions": "backend", "build_backend": "backend", "APIError": "errors", "serve": "serve"}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'helios.server' has no attribute {name!r}")
    return getattr(importlib.import_module(f"helios.server.{module}"), name)

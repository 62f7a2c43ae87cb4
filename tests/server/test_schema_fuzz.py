"""Schema-driven fuzzing of every endpoint with schemathesis, from the server's own OpenAPI
schema (/openapi.json), with valid and invalid requests (positive and negative generation),
over real loopback HTTP against the sim engine. The server never answers 5xx, every error is
in OpenAI's shape, and afterwards /health is OK and every slot and page is free.
bench/reliability.py runs the same fuzz (schema_fuzz.fuzz) once against the real model."""

from __future__ import annotations

import httpx
import pytest

from helios.server import EngineOptions, ServerSettings, build_backend, create_app

from .schema_fuzz import fuzz
from .support import InProcessServer, is_idle, metrics, wait_for

EXAMPLES = 60  # per operation and generation mode (the bench runs more)


@pytest.fixture(scope="module")
def fuzz_server():
    backend = build_backend(EngineOptions(engine="sim", slots=4, max_context=256, prefill_capacity=256,
                                          sim_pace=0.0))
    server = InProcessServer(create_app(backend, ServerSettings(max_queue=8, max_body_bytes=64 * 1024)))
    yield server
    server.stop()


def test_schema_fuzz_every_endpoint_never_5xx_and_leaves_nothing_behind(fuzz_server):
    """Rule: bad input gets a 4xx in OpenAI's error shape, never a 5xx; the server survives,
    /health is OK afterwards, and every slot and page is free."""
    tried = fuzz(fuzz_server.url, EXAMPLES)
    print(f"\nschemathesis: {sum(tried.values())} requests; by operation and status {tried}")
    assert sum(tried.values()) >= 150, "the fuzz sent too few requests to mean anything"
    assert any(k.endswith(" 200") and "completions" in k for k in tried), "no valid completion got through"
    assert any(k.endswith(" 400") for k in tried), "no invalid request was generated"
    assert httpx.get(fuzz_server.url + "/health", timeout=10).json() == {"status": "ok"}
    wait_for(lambda: is_idle(metrics(fuzz_server.url)), 60, "every slot and page to be free after the fuzz")

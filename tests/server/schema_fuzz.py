"""Fuzz every operation of a running server's OpenAPI schema with schemathesis (positive and
negative generation), checking: no 5xx, and every error in OpenAI's shape. Shared by
test_schema_fuzz.py (sim engine) and bench/reliability.py (the real model)."""

from __future__ import annotations

from collections import Counter

import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error


def _whole(value):
    """JSON Schema counts 1.0 as an integer and schemathesis generates it, but this server's types
    are strict (`2.0` is not a max_tokens, as docs/server.md says): send whole floats as the ints
    that clients send, so that positive generation yields valid bodies often enough to test them."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [_whole(v) for v in value]
    if isinstance(value, dict):
        return {k: _whole(v) for k, v in value.items()}
    return value


@schemathesis.hook
def map_body(context, body):
    return _whole(body)


@schemathesis.check
def openai_error_shape(ctx, response, case):
    """Every 4xx/5xx body is OpenAI's {"error": {message, type, param, code}}."""
    if response.status_code >= 400:
        err = response.json().get("error")
        if not isinstance(err, dict) or set(err) != {"message", "type", "param", "code"} or not err["message"]:
            raise AssertionError(f"not OpenAI's error shape: {response.text[:300]}")


def fuzz(url: str, examples: int, timeout_s: float = 120.0) -> Counter:
    """Fuzz every operation; returns requests sent by "METHOD path status". Raises on the
    first failed check (hypothesis shrinks it first)."""
    schema = schemathesis.openapi.from_url(url + "/openapi.json")
    tried: Counter = Counter()
    for result in schema.get_all_operations():
        operation = result.ok()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            @settings(max_examples=examples, deadline=None, database=None,
                      suppress_health_check=list(HealthCheck))
            @given(case=operation.as_strategy(generation_mode=mode))
            def run(case):
                response = case.call(base_url=url, timeout=timeout_s)
                tried[f"{case.method} {operation.path} {response.status_code}"] += 1
                case.validate_response(response, checks=[not_a_server_error, openai_error_shape])
            try:
                run()
            except Unsatisfiable:
                # An operation with no inputs (GET /health) has no invalid request to generate.
                if mode is GenerationMode.POSITIVE:
                    raise
    return tried

"""Server hardening on the sim engine (issue 42): limits before work, fair admission, the API
key, content types, CORS, connection limits, and every refusal counted.

Rules tested (each failed on the server before issue 42):
- a prompt longer in bytes than the context can hold (max_context x the longest token) is a 400
  before the tokenizer sees it; one under the bound is tokenized and checked in tokens;
- request bodies are parsed off the event loop: /health answers and a running stream goes on
  while a body is being parsed;
- one request's n cannot take the whole admission limit (400 naming n past the client share),
  and while one client holds its share another client is still admitted;
- /v1/* needs `Authorization: Bearer KEY` with an API key (from --api-key or FLARE_API_KEY);
  /health and /metrics stay open; a non-loopback bind without a key prints a warning;
- a POST that is not application/json is a 415; CORS headers only for allowed origins;
- a connection that sends no complete headers within the header timeout is closed, one past
  the connection cap is closed at once, and a body that does not arrive in time gets 408;
- a client that disconnects mid-upload is logged in one line, without a traceback;
- flare_requests_rejected_total{reason} counts every refusal, parse errors included.
"""

from __future__ import annotations

import argparse
import json
import logging
import socket
import threading

import httpx
import pytest

from helios.server.app import ServerSettings, create_app
from helios.server.backend import EngineOptions, build_backend
from helios.server.guards import rejection_reason
from helios.server.hardening_cli import add_hardening_arguments, exposure_warning, hardening_settings

from .support import InProcessServer, metrics, value, wait_for
from .test_api import CoreGate, assert_error, make_client, service

JSON = {"content-type": "application/json"}


def test_an_oversized_prompt_is_refused_before_the_tokenizer_sees_it():
    with make_client(pace=0.0) as c:
        s = service(c)
        tokenizer, seen = s.backend.tokenizer, []
        encode = tokenizer.encode
        tokenizer.encode = lambda text: seen.append(len(text)) or encode(text)
        bound = s.backend.max_context * s.longest_token
        r = c.post("/v1/completions", json={"prompt": "a" * (bound + 1), "max_tokens": 1})
        assert assert_error(r, 400, "prompt")["code"] == "context_length_exceeded"
        chat = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "b" * (bound + 1)}]})
        assert assert_error(chat, 400, "messages")["code"] == "context_length_exceeded"
        ids = c.post("/v1/completions", json={"prompt": [1] * s.backend.max_context})
        assert assert_error(ids, 400, "prompt")["code"] == "context_length_exceeded"
        assert max(seen, default=0) <= bound  # never tokenized
        r = c.post("/v1/completions", json={"prompt": "a" * bound, "max_tokens": 1})
        assert assert_error(r, 400, "prompt")["code"] == "context_length_exceeded"  # at the bound: in tokens
        assert max(seen) == bound


def test_health_and_a_running_stream_go_on_while_a_body_is_parsed(monkeypatch):
    import helios.server.app as app_module

    backend = build_backend(EngineOptions(engine="sim", slots=2, max_context=256, prefill_capacity=256,
                                          sim_pace=0.2))
    server = InProcessServer(create_app(backend, ServerSettings()))
    parsing, release = threading.Event(), threading.Event()
    parse = app_module.parse_body

    def slow_parse(model, raw):  # stands for a large body's parse: it holds its thread until released
        if b"slow" in raw:
            parsing.set()
            release.wait(60)
        return parse(model, raw)

    monkeypatch.setattr(app_module, "parse_body", slow_parse)
    try:
        with httpx.Client(base_url=server.url, timeout=30) as http, \
                http.stream("POST", "/v1/completions", json={"prompt": "stream", "max_tokens": 40,
                                                             "stream": True}) as stream:
            lines = stream.iter_lines()
            assert next(lines).startswith("data: ")
            held = threading.Thread(target=lambda: http.post("/v1/completions", json={"prompt": "slow",
                                                                                        "max_tokens": 2}))
            held.start()
            assert parsing.wait(30)
            assert http.get("/health").status_code == 200  # answered while the parse holds its thread
            got = [line for line, _ in zip(lines, range(6)) if line.startswith("data: ")]
            assert len(got) >= 3  # the stream kept going too
            release.set()
            held.join(60)
    finally:
        release.set()
        server.stop()


def test_one_request_or_one_client_never_takes_the_whole_admission_limit():
    with make_client(slots=1, max_queue=3, pace=0.0) as c:  # limit 4, one client holds at most 2
        s = service(c)
        r = c.post("/v1/completions", json={"prompt": "x", "max_tokens": 2, "n": 4})
        assert "one client may hold at most 2" in assert_error(r, 400, "n")["message"]
        gate = CoreGate(s.backend.core)
        done = []
        t = threading.Thread(target=lambda: done.append(c.post("/v1/completions", json={
            "prompt": "held", "max_tokens": 5, "n": 2, "user": "alice"})))
        t.start()
        wait_for(lambda: s.live == 2 and gate.entered.is_set(), 30, "alice's two choices admitted")
        again = c.post("/v1/completions", json={"prompt": "more", "max_tokens": 2, "user": "alice"})
        assert assert_error(again, 429)["code"] == "client_share_full"
        other = []
        t2 = threading.Thread(target=lambda: other.append(c.post("/v1/completions", json={
            "prompt": "bob", "max_tokens": 2, "user": "bob"})))
        t2.start()
        wait_for(lambda: s.live == 3, 30, "bob admitted while alice holds her share")
        gate.release.set()
        t.join(60)
        t2.join(60)
        assert done[0].status_code == 200 and other[0].status_code == 200
        assert s.admission.by_client == {} and s.live == 0


def test_the_api_key_guards_v1_only():
    with make_client(pace=0.0, api_key="s3cret") as c:
        assert assert_error(c.get("/v1/models"), 401)["code"] == "invalid_api_key"
        assert c.get("/v1/models").headers["www-authenticate"] == "Bearer"
        wrong = c.post("/v1/completions", json={"prompt": "x"}, headers={"authorization": "Bearer nope"})
        assert assert_error(wrong, 401)["code"] == "invalid_api_key"
        ok = c.post("/v1/completions", json={"prompt": "x", "max_tokens": 2},
                    headers={"authorization": "Bearer s3cret"})
        assert ok.status_code == 200
        assert c.get("/health").status_code == 200 and c.get("/metrics").status_code == 200
        assert value(_scrape(c), "flare_requests_rejected_total", reason="unauthorized") == 3


def _args(*argv):
    parser = argparse.ArgumentParser()
    add_hardening_arguments(parser, float, float, int)
    return parser.parse_args(argv)


def test_the_api_key_comes_from_the_flag_or_the_environment_and_exposure_warns():
    assert hardening_settings(_args(), environ={"FLARE_API_KEY": "env"})["api_key"] == "env"
    assert hardening_settings(_args("--api-key", "flag"), environ={"FLARE_API_KEY": "env"})["api_key"] == "flag"
    assert hardening_settings(_args(), environ={})["api_key"] is None
    assert hardening_settings(_args("--allowed-origins", "https://a.example, https://b.example"),
                              environ={})["allowed_origins"] == ("https://a.example", "https://b.example")
    assert "without an API key" in exposure_warning("0.0.0.0", None)
    assert exposure_warning("0.0.0.0", "k") is None
    assert all(exposure_warning(h, None) is None for h in ("127.0.0.1", "::1", "localhost", "127.0.0.2"))


def test_a_post_that_is_not_json_is_a_415_and_counted():
    with make_client(pace=0.0) as c:
        for headers in ({"content-type": "text/plain"}, {}):
            r = c.post("/v1/completions", content=json.dumps({"prompt": "x"}), headers=headers)
            assert assert_error(r, 415)["code"] == "unsupported_media_type"
        ok = c.post("/v1/completions", content=json.dumps({"prompt": "x", "max_tokens": 1}),
                    headers={"content-type": "application/json; charset=utf-8"})
        assert ok.status_code == 200
        assert value(_scrape(c), "flare_requests_rejected_total", reason="unsupported_media_type") == 2


def test_cors_headers_only_for_allowed_origins():
    preflight = {"origin": "https://app.example", "access-control-request-method": "POST",
                 "access-control-request-headers": "content-type"}
    with make_client(pace=0.0, allowed_origins=("https://app.example",)) as c:
        r = c.options("/v1/chat/completions", headers=preflight)
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "https://app.example"
        other = c.options("/v1/chat/completions", headers={**preflight, "origin": "https://evil.example"})
        assert "access-control-allow-origin" not in other.headers
    with make_client(pace=0.0) as c:
        assert "access-control-allow-origin" not in c.get("/v1/models", headers={"origin": "https://app.example"}).headers


def test_every_refusal_is_counted_parse_errors_included():
    with make_client(pace=0.0) as c:
        before = _scrape(c)
        c.post("/v1/completions", content=b"{not json", headers=JSON)
        c.post("/v1/completions", json={"prompt": "x", "temprature": 1})
        c.post("/v1/completions", json={"prompt": "x", "model": "other"})
        c.get("/v1/nothing")
        after = _scrape(c)
        delta = {reason: value(after, "flare_requests_rejected_total", reason=reason)
                 - value(before, "flare_requests_rejected_total", reason=reason) for reason in ("invalid", "not_found")}
        assert delta == {"invalid": 2, "not_found": 2}


def test_errors_after_admission_are_not_counted_as_refusals():
    assert rejection_reason(500, "engine_error") is None and rejection_reason(503, "cancelled") is None
    assert rejection_reason(503, "shutting_down") == "draining"
    assert rejection_reason(429, "client_share_full") == "client_share"
    assert rejection_reason(400, "context_length_exceeded") == "too_long"


def _scrape(client) -> dict:
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for family in text_string_to_metric_families(client.get("/metrics").text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def _served(settings: ServerSettings):
    backend = build_backend(EngineOptions(engine="sim", slots=2, max_context=256, prefill_capacity=256, sim_pace=0.0))
    return InProcessServer(create_app(backend, settings), settings=settings)


@pytest.fixture()
def limited():
    server = _served(ServerSettings(header_timeout_s=0.5, body_timeout_s=0.5))
    yield server
    server.stop()


@pytest.fixture()
def capped():  # header timeout far beyond the tests' 30-s read bound: only the cap can close a connection
    server = _served(ServerSettings(header_timeout_s=600, max_connections=3))
    yield server
    server.stop()


def _closed_by_server(sock: socket.socket) -> bytes:
    sock.settimeout(30)  # bounds a hang only: the server closes it long before
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def test_slow_headers_are_closed(limited):
    slow = socket.create_connection(("127.0.0.1", limited.port))
    slow.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\n")  # and never the rest
    assert _closed_by_server(slow) == b""


def test_slow_headers_of_a_second_request_on_a_kept_alive_connection_are_closed(limited):
    conn = socket.create_connection(("127.0.0.1", limited.port))
    conn.settimeout(30)
    conn.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
    reply = b""
    while b"\r\n\r\n" not in reply or not reply.endswith(b"}"):
        reply += conn.recv(65536)
    assert reply.startswith(b"HTTP/1.1 200")
    conn.sendall(b"GET /health HTTP/1.1\r\n")  # and never the rest
    assert _closed_by_server(conn) == b""


def test_a_connection_past_the_cap_is_closed_and_the_others_still_served(capped):
    held = [socket.create_connection(("127.0.0.1", capped.port)) for _ in range(2)]
    try:
        extra = [socket.create_connection(("127.0.0.1", capped.port)) for _ in range(2)]
        # the third connection is within the cap (3) and stays; the fourth is closed at once
        extra[1].settimeout(30)
        assert _closed_by_server(extra[1]) == b""
        extra[0].sendall(b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        assert _closed_by_server(extra[0]).startswith(b"HTTP/1.1 200")
    finally:
        for s in held:
            s.close()


def test_a_slow_body_gets_408_and_a_client_leaving_mid_upload_one_log_line(limited, caplog):
    slow = socket.create_connection(("127.0.0.1", limited.port))
    slow.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                 b"content-length: 1000\r\n\r\n{\"prompt\": ")
    reply = _closed_by_server(slow)
    assert reply.startswith(b"HTTP/1.1 408") and b"body_timeout" in reply
    caplog.set_level(logging.INFO)
    gone = socket.create_connection(("127.0.0.1", limited.port))
    gone.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                 b"content-length: 100000\r\n\r\n{\"prompt\": \"abc")
    gone.close()
    wait_for(lambda: [r for r in caplog.records if "during its upload" in r.getMessage()], 30,
             "the disconnect to be logged", poll_s=0.05)
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    assert len([r for r in caplog.records if "during its upload" in r.getMessage()]) == 1
    assert value(metrics(limited.url), "flare_requests_rejected_total", reason="client_disconnected") == 1

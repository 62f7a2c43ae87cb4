"""Service classes on the API (issue 40): priority, service_tier and user select the class and tenant,
--service-classes loads a table, an unknown class is a 400, /metrics has per-class families."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from helios.class_table import load_class_table
from helios.scheduler.service_class import BUILTIN_TABLE
from helios.server import EngineOptions, ServerSettings, build_backend, create_app
from helios.server.command import class_policy
from helios.server.errors import APIError
from helios.server.schemas import ChatCompletionRequest
from helios.server.service_classes import ClassPolicy, request_class

TABLE = {"default": "standard", "classes": {"gold": {"ttft_ms": 200, "gap_ms": 50, "weight": 8, "priority": -1}},
         "tenants": {"acme": {"weight": 3, "class": "gold"}}}


def req(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}], **fields)


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    path = tmp_path_factory.mktemp("classes") / "classes.json"
    path.write_text(json.dumps(TABLE))
    return load_class_table(path)


def test_service_tier_names_the_class(table):
    policy = ClassPolicy(table, "service_tier")
    assert request_class(req(service_tier="gold"), policy)["service_class"].name == "gold"
    assert request_class(req(), policy)["service_class"].name == "standard"  # the table's default
    assert request_class(req(service_tier="auto", user="acme"), policy)["service_class"].name == "gold"  # tenant's
    assert request_class(req(service_tier="flex"), policy)["service_class"].name == "batch"  # OpenAI's tier
    assert request_class(req(service_tier="priority"), policy)["service_class"].name == "interactive"
    with pytest.raises(APIError) as e:
        request_class(req(service_tier="platinum"), policy)
    assert e.value.status == 400 and e.value.param == "service_tier" and "platinum" in str(e.value)


def test_priority_and_user_select_the_class(table):
    by_priority = ClassPolicy(table, "priority")
    assert request_class(req(priority=-5), by_priority)["service_class"].name == "gold"
    assert request_class(req(priority=2), by_priority)["service_class"].name == "batch"
    got = request_class(req(priority=0, user="acme"), by_priority)
    assert got["priority"] == 0 and got["tenant_weight"] == 3.0
    by_user = ClassPolicy(table, "user")
    assert request_class(req(user="acme", service_tier="batch"), by_user)["service_class"].name == "gold"
    assert request_class(req(user="other"), by_user)["service_class"].name == "standard"
    assert request_class(req(user="other"), by_user)["tenant_weight"] == 1.0


def test_class_policy_from_flags(tmp_path):
    assert class_policy(None, "user").table is BUILTIN_TABLE
    bad = tmp_path / "bad.toml"
    bad.write_text("[classes.x]\nweight = -1\n")
    with pytest.raises(Exception, match=r"bad.toml: classes.x.weight"):
        class_policy(str(bad), "service_tier")


def test_requests_carry_their_class_to_the_scheduler_and_metrics(table):
    backend = build_backend(EngineOptions(engine="sim", slots=4, max_context=256, prefill_capacity=256,
                                          sim_pace=0.0))
    seen = []
    admit = backend.scheduler.admit

    def spy(spec, now_ns):
        seen.append(spec)
        return admit(spec, now_ns)

    backend.scheduler.admit = spy
    settings = ServerSettings(classes=ClassPolicy(table, "service_tier"))
    with TestClient(create_app(backend, settings)) as client:
        body = {"model": backend.model_id, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
        assert client.post("/v1/chat/completions", json={**body, "service_tier": "gold", "user": "acme",
                                                         "priority": 3}).status_code == 200
        assert client.post("/v1/chat/completions", json=body).status_code == 200
        r = client.post("/v1/chat/completions", json={**body, "service_tier": "nope"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "service_tier"
        assert client.post("/v1/chat/completions", json={**body, "priority": "high"}).status_code == 400
        text = client.get("/metrics").text
    assert [(s.service_class.name, s.client, s.tenant_weight, s.priority) for s in seen] == [
        ("gold", "acme", 3.0, 3), ("standard", "addr:testclient", 1.0, None)]  # no `user`: its address
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(text) for s in f.samples}
    assert samples[("flare_class_time_to_first_token_seconds_count", (("class", "gold"),))] == 1
    assert samples[("flare_class_generation_tokens_total", (("class", "standard"),))] > 0
    assert samples[("flare_class_requests_finished_total", (("class", "gold"), ("finish_reason", "length")))] == 1
    assert samples[("flare_time_to_first_token_seconds_count", ())] == 2  # the unlabelled families stay

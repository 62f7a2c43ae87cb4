"""Service classes and tenants (issue 40, step 1): validation, built-ins, tables from TOML/JSON."""

import json

import pytest

from helios.class_table import load_class_table
from helios.errors import ConfigError, InvalidRequest
from helios.scheduler.request_spec import RequestSpec
from helios.scheduler.service_class import (BUILTIN_TABLE, DEFAULT_CLASS, ClassTable, ServiceClass, Tenant,
                                            table_from_mapping)


def test_default_class_has_no_targets_and_unit_weight():
    assert DEFAULT_CLASS.name == "default" and not DEFAULT_CLASS.has_targets and DEFAULT_CLASS.weight == 1.0
    assert RequestSpec(8, 4).service_class is DEFAULT_CLASS and RequestSpec(8, 4).tenant_weight == 1.0


def test_builtin_classes_are_ordered_by_urgency():
    c = BUILTIN_TABLE.classes
    assert set(c) == {"default", "interactive", "standard", "batch"}
    assert c["interactive"].priority < c["standard"].priority < c["batch"].priority
    assert c["interactive"].weight > c["standard"].weight > c["batch"].weight > 0
    assert c["batch"].ttft_ms is None and c["batch"].deadline_ms is not None


@pytest.mark.parametrize("kwargs, field", [
    ({"ttft_ms": -1}, "ttft_ms"), ({"gap_ms": 0}, "gap_ms"), ({"deadline_ms": float("inf")}, "deadline_ms"),
    ({"weight": 0}, "weight"), ({"weight": True}, "weight"), ({"priority": 1.5}, "priority"),
    ({"ttft_per_token_ms": "3"}, "ttft_per_token_ms"),
])
def test_class_validation_names_the_field(kwargs, field):
    with pytest.raises(ConfigError) as e:
        ServiceClass("x", **kwargs)
    assert e.value.field == field


def test_first_token_target_adds_the_per_token_part():
    c = ServiceClass("summ", ttft_ms=200.0, ttft_per_token_ms=0.5)
    assert c.first_token_target_ms(1000) == 700.0
    assert ServiceClass("b", deadline_ms=10.0).first_token_target_ms(1000) is None
    assert ServiceClass("p", ttft_per_token_ms=2.0).first_token_target_ms(10) == 20.0


def test_table_lookup_by_name_tenant_and_priority():
    t = table_from_mapping({"classes": {"gold": {"ttft_ms": 100, "priority": -1, "weight": 8}},
                            "tenants": {"acme": {"weight": 3, "class": "gold"}}})
    assert t.service_class("gold").ttft_ms == 100.0
    assert t.service_class(None, "acme").name == "gold"  # the tenant's class when none is named
    assert t.service_class(None, "nobody") is t.classes["default"]
    assert t.tenant_weight("acme") == 3.0 and t.tenant_weight("nobody") == 1.0
    assert t.by_priority(-5).name == "gold" and t.by_priority(0).name in ("default", "interactive")
    assert t.by_priority(99).name == "batch"
    with pytest.raises(ConfigError, match="unknown class 'platinum'"):
        t.service_class("platinum")


@pytest.mark.parametrize("data, field", [
    ({"classes": {"x": {"ttft_ms": -3}}}, "T: classes.x.ttft_ms"),
    ({"classes": {"x": {"ttft": 3}}}, "T: classes.x.ttft"),
    ({"classes": {"x": 3}}, "T: classes.x"),
    ({"tenants": {"a": {"weight": -1}}}, "T: tenants.a.weight"),
    ({"tenants": {"a": {"class": "nope"}}}, "T: tenants"),
    ({"default": "nope"}, "T: default"),
    ({"clases": {}}, "T: clases"),
    ([1, 2], "T"),
])
def test_malformed_tables_name_source_and_field(data, field):
    with pytest.raises(ConfigError) as e:
        table_from_mapping(data, "T")
    assert e.value.field == field


def test_load_toml_and_json_agree(tmp_path):
    toml = tmp_path / "classes.toml"
    toml.write_text('default = "chat"\n[classes.chat]\nttft_ms = 300\ngap_ms = 50\nweight = 2\n'
                    '[tenants.acme]\nweight = 4\n')
    js = tmp_path / "classes.json"
    js.write_text(json.dumps({"default": "chat", "classes": {"chat": {"ttft_ms": 300, "gap_ms": 50, "weight": 2}},
                              "tenants": {"acme": {"weight": 4}}}))
    a, b = load_class_table(toml), load_class_table(js)
    assert a == b or (dict(a.classes) == dict(b.classes) and dict(a.tenants) == dict(b.tenants))
    assert a.default == "chat" and a.classes["chat"].gap_ms == 50.0 and a.tenants["acme"] == Tenant("acme", 4.0)
    assert "interactive" in a.classes  # built-ins kept
    assert "interactive" not in load_class_table(js, builtins=False).classes


def test_load_errors_name_the_file(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[classes.x\n")
    with pytest.raises(ConfigError, match="bad.toml.*not valid TOML"):
        load_class_table(bad)
    with pytest.raises(ConfigError, match="missing.json.*cannot read"):
        load_class_table(tmp_path / "missing.json")
    field = tmp_path / "f.json"
    field.write_text('{"classes": {"x": {"weight": 0}}}')
    with pytest.raises(ConfigError) as e:
        load_class_table(field)
    assert e.value.field == f"{field}: classes.x.weight"


def test_request_spec_checks_class_tenant_and_priority():
    gold = ServiceClass("gold", ttft_ms=100.0, priority=-2)
    assert RequestSpec(8, 4, service_class=gold).effective_priority == -2
    assert RequestSpec(8, 4, service_class=gold, priority=5).effective_priority == 5
    for bad in ({"service_class": "gold"}, {"tenant_weight": 0}, {"tenant_weight": float("nan")},
                {"priority": 1.0}):
        with pytest.raises(InvalidRequest):
            RequestSpec(8, 4, **bad)


def test_class_table_rejects_mismatched_entries():
    with pytest.raises(ConfigError):
        ClassTable({"a": ServiceClass("b")}, {}, "a")

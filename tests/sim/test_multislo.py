"""The multi-SLO workload (issue 40): the file format and its errors, the mix, per-class attainment,
multi-SLO goodput."""

from __future__ import annotations

import copy
import json

import pytest

from helios.errors import ConfigError
from helios.scheduler.plan import FinishReason
from helios.scheduler.service_class import ServiceClass
from helios.sim.class_metrics import class_metrics, meets_class, prepare, resolve_classes, run_mix
from helios.sim.experiment import Setup
from helios.sim.loop import RequestLog
from helios.sim.metrics import NS_PER_S, goodput_sweep
from helios.sim.multislo import (SHARED, SHARED_MAPPING, build_requests, deadline_only, load_workload_file,
                                 rescale_requests, without_deadline_only, workload_from_mapping)

MS = 1_000_000


def log(cls: str, arrival_ms: float, pubs_ms, prompt=100, finished=True) -> RequestLog:
    pubs = [(int(t * MS), 1) for t in pubs_ms]
    done = pubs[-1][0] if finished and pubs else None
    return RequestLog(int(arrival_ms * MS), "t", prompt, pubs, [], FinishReason.EOS if done else None, done,
                      service_class=cls)


def test_a_request_meets_only_the_targets_its_class_states():
    chat = ServiceClass("chat", ttft_ms=100.0, gap_ms=50.0)
    summ = ServiceClass("summ", ttft_per_token_ms=2.0, gap_ms=500.0)  # 200 ms for a 100-token prompt
    batch = ServiceClass("batch", deadline_ms=1000.0)
    slow_start = log("x", 0, [150, 160, 170])  # TTFT 150, gaps 10
    stall = log("x", 0, [50, 400, 410])  # TTFT 50, a 350-ms gap
    late = log("x", 0, [900, 1500])  # finishes at 1500
    assert not meets_class(slow_start, chat) and meets_class(slow_start, summ) and meets_class(slow_start, batch)
    assert not meets_class(stall, chat) and meets_class(stall, summ) and meets_class(stall, batch)
    assert not meets_class(late, chat) and not meets_class(late, summ) and not meets_class(late, batch)
    assert not meets_class(log("x", 0, [10], finished=False), batch)  # unfinished never meets


def test_class_metrics_split_requests_by_class():
    classes = {"chat": ServiceClass("chat", ttft_ms=100.0), "batch": ServiceClass("batch", deadline_ms=10_000.0)}
    logs = [log("chat", 0, [50, 60]), log("chat", 0, [500, 510]), log("batch", 0, [5000, 6000])]
    m = class_metrics(logs, classes)
    assert m["chat"].requests == 2 and m["chat"].attainment == 0.5
    assert m["batch"].requests == 1 and m["batch"].attainment == 1.0


def test_multi_slo_goodput_needs_every_class():
    # Two classes: one passes up to scale 2, the other only up to 1; goodput is the lower knee.
    class Run:
        def __init__(self, s):
            self.offered_rate = s
            self.slo_attainment = min(1.0 if s <= 2 else 0.5, 1.0 if s <= 1 else 0.5)

    result = goodput_sweep(Run, [0.5, 1.0, 1.5, 2.0, 3.0], resolution=0.05, refine=10)
    assert result.status == "bracketed" and 1.0 <= result.goodput <= 1.5 and result.goodput < 1.06


def test_shared_workload_builds_every_stream_deterministically():
    a = build_requests(SHARED, seed=0)
    assert a == build_requests(SHARED, seed=0) and a != build_requests(SHARED, seed=1)
    by = {c: [r for r in a if r.service_class == c] for c in SHARED.classes}
    assert all(by.values())  # every class has requests
    # Each trace stream gets rate x duration requests; premium and chat draw different Azure windows.
    assert len(by["chat"]) == round(1.2 * SHARED.duration_s) and len(by["premium"]) == round(0.4 * SHARED.duration_s)
    assert [r.prompt_tokens for r in by["chat"][:20]] != [r.prompt_tokens for r in by["premium"][:20]]
    assert min(r.prompt_tokens for r in by["summarize"]) > max(r.prompt_tokens for r in by["batch"]) / 4
    assert all(r.arrival_ns < SHARED.duration_s * NS_PER_S for r in a)
    assert [r.arrival_ns for r in a] == sorted(r.arrival_ns for r in a)
    fast = rescale_requests(a, 2.0)
    assert fast[-1].arrival_ns == pytest.approx(a[-1].arrival_ns / 2, abs=1)


def test_scaled_slos_follow_the_cost_model():
    requests = build_requests(SHARED, seed=0)
    h100 = resolve_classes(SHARED, requests, Setup())
    a100 = resolve_classes(SHARED, requests, Setup(cost_model="a100-34b-tp2"))
    assert h100["premium"].ttft_ms < h100["chat"].ttft_ms  # 2x against 3x of similar prompts
    assert h100["summarize"].ttft_per_token_ms and h100["summarize"].ttft_ms is None
    assert h100["batch"].deadline_ms and h100["batch"].gap_ms is None and h100["batch"].ttft_ms is None
    assert h100["chat"].gap_ms != a100["chat"].gap_ms  # scaled to each cost model
    assert [c.priority for c in h100.values()] == [0, 1, 2, 3]


def test_workload_file_round_trips(tmp_path):
    path = tmp_path / "mix.json"
    path.write_text(json.dumps(SHARED_MAPPING))
    assert load_workload_file(path) == SHARED
    toml = tmp_path / "mix.toml"
    toml.write_text('duration_s = 30\n[classes.chat]\nttft_ms = 500\ngap_scale = 10\nweight = 2\n'
                    '[[streams]]\nname = "c"\ntrace = "azure"\nclass = "chat"\nrate = 1.5\ntenant = "acme"\n'
                    '[tenants.acme]\nweight = 3\n')
    w = load_workload_file(toml)
    assert w.duration_s == 30 and w.streams[0].tenant == "acme" and w.tenants["acme"].weight == 3
    assert w.classes["chat"].ms == {"ttft": 500.0} and w.classes["chat"].scale == {"gap": 10.0}


def _broken(change):
    data = copy.deepcopy(SHARED_MAPPING)
    change(data)
    return data


@pytest.mark.parametrize("change, field", [
    (lambda d: d["streams"][0].update(rate=0), "W: streams[0].rate"),
    (lambda d: d["streams"][1].update(trace="nosuch"), "W: streams[1].trace"),
    (lambda d: d["streams"][1].update({"class": "gold"}), "W: streams[1].class"),
    (lambda d: d["streams"][2].pop("rate"), "W: streams[2].rate"),
    (lambda d: d["streams"][0].update(colour=1), "W: streams[0].colour"),
    (lambda d: d["classes"]["chat"].update(ttft_ms=5), "W: classes.chat.ttft_ms"),  # both ms and scale
    (lambda d: d["classes"]["chat"].update(gap_scale=-1), "W: classes.chat.gap_scale"),
    (lambda d: d["classes"].update(empty={}), "W: classes.empty"),
    (lambda d: d.update(streams=[]), "W: streams"),
    (lambda d: d.update(target=1.5), "W: target"),
    (lambda d: d.update(extra=1), "W: extra"),
])
def test_malformed_workloads_name_the_field(change, field):
    with pytest.raises(ConfigError) as e:
        workload_from_mapping(_broken(change), "W")
    assert e.value.field == field


def test_workload_file_errors_name_the_file(tmp_path):
    bad = tmp_path / "w.toml"
    bad.write_text("streams = [")
    with pytest.raises(ConfigError, match="w.toml.*not valid TOML"):
        load_workload_file(bad)
    with pytest.raises(ConfigError, match="cannot read"):
        load_workload_file(tmp_path / "none.json")


def test_a_light_mix_run_logs_every_class():
    mini = workload_from_mapping({"duration_s": 6.0, "classes": {
        "chat": {"ttft_scale": 5, "gap_scale": 10}, "batch": {"deadline_scale": 4}},
        "streams": [{"name": "c", "trace": "azure", "class": "chat", "rate": 1.0},
                    {"name": "b", "trace": "sharegpt", "class": "batch", "rate": 1.0}]})
    setup = Setup(request_slots=8)
    mix = prepare(mini, setup, seed=0)
    m, sim = run_mix("sarathi", mix, setup, scale=0.5)
    assert set(m.per_class) == {"chat", "batch"}
    assert sum(c.requests for c in m.per_class.values()) == len(mix.requests) == len(sim.logs)
    assert {log.service_class for log in sim.logs.values()} == {"chat", "batch"}
    assert all(log.finish is not None for log in sim.logs.values())


def test_mix_report_writes_tables_plot_and_json(tmp_path):
    from helios.sim.multislo_report import MixReportConfig, run_mix_report

    mini = workload_from_mapping({"duration_s": 5.0, "classes": {
        "chat": {"ttft_scale": 5, "gap_scale": 10, "priority": 0}, "batch": {"deadline_scale": 4, "priority": 1}},
        "streams": [{"name": "c", "trace": "azure", "class": "chat", "rate": 1.0},
                    {"name": "b", "trace": "sharegpt", "class": "batch", "rate": 1.0}]})
    cfg = MixReportConfig(mini, name="mini", schedulers=("sarathi", "vllm-priority"), seeds=(0,), loads=(0.5,),
                          sweep=(0.5, 50.0), refine=1, setup=Setup(request_slots=8))
    path = run_mix_report(cfg, tmp_path, command="flare sim report --workload mini")
    text = path.read_text()
    assert "| sarathi |" in text and "| vllm-priority |" in text and "chat" in text and "batch" in text
    assert (tmp_path / "class-attainment.png").stat().st_size > 0
    data = json.loads((tmp_path / "results.json").read_text())
    assert {r["scheduler"] for r in data["results"]} == {"sarathi", "vllm-priority"}
    for r in data["results"]:
        assert r["status"] in ("bracketed", "at-least", "below")
        assert set(r["runs"]["0.5"]["classes"]) == {"chat", "batch"}


def test_cli_workload_errors_are_one_line(tmp_path, capsys):
    from helios.cli import main

    bad = tmp_path / "mix.toml"
    bad.write_text('[classes.chat]\nttft_ms = 100\n[[streams]]\nname = "c"\ntrace = "azure"\nclass = "chat"\nrate = 0\n')
    assert main(["sim", "report", "--workload", str(bad), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.strip() == f"flare sim report: {bad}: streams[0].rate: must be a positive number, got 0"
    assert not (tmp_path / "out").exists()


def test_cli_runs_a_workload_file(tmp_path, capsys):
    from helios.cli import main

    mix = tmp_path / "mix.json"
    mix.write_text(json.dumps({"duration_s": 4.0, "classes": {"chat": {"ttft_scale": 5, "gap_scale": 10}},
                               "streams": [{"name": "c", "trace": "azure", "class": "chat", "rate": 1.0}]}))
    assert main(["sim", "report", "--workload", str(mix), "--schedulers", "edf", "--seeds", "0", "--loads", "0.5",
                 "--sweep", "0.5", "--refine", "1", "--out", str(tmp_path / "out")]) == 0
    text = (tmp_path / "out" / "report.md").read_text()
    assert "| edf |" in text and "chat" in text


def test_without_deadline_only_keeps_every_other_request_unchanged():
    # The headroom bench (bench/multislo_headroom.py) compares a mix with itself minus its batch work:
    # only the deadline-only classes and their streams may go, and each remaining stream must draw the
    # same requests (each stream has its own random draws), or the two goodputs would not compare.
    assert deadline_only(SHARED) == {"batch"}
    trimmed = without_deadline_only(SHARED)
    assert set(trimmed.classes) == {"premium", "chat", "summarize"}
    assert [s.name for s in trimmed.streams] == ["premium", "chat", "summarize"]
    whole = [r for r in build_requests(SHARED, seed=3) if r.service_class != "batch"]
    assert build_requests(trimmed, seed=3) == whole
    # A class with a deadline and another target is not deadline-only.
    mapping = copy.deepcopy(SHARED_MAPPING)
    mapping["classes"]["batch"]["gap_scale"] = 50.0
    assert deadline_only(workload_from_mapping(mapping)) == set()


def test_a_mix_of_only_deadline_classes_has_nothing_left_to_measure():
    mapping = {"classes": {"batch": {"deadline_ms": 60_000}},
               "streams": [{"name": "b", "trace": "sharegpt", "class": "batch", "rate": 1.0}]}
    with pytest.raises(ConfigError, match="deadline-only"):
        without_deadline_only(workload_from_mapping(mapping))
    # A deadline-only stream before a kept one: removing it would shift the kept stream's draws.
    mapping = copy.deepcopy(SHARED_MAPPING)
    mapping["streams"].insert(0, mapping["streams"].pop())
    with pytest.raises(ConfigError, match="after the others"):
        without_deadline_only(workload_from_mapping(mapping))

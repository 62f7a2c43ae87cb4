"""The decision log (helios.runtime.decisions): what the step loop records, and what a reader sees.

Rules: every committed plan is recorded once, in fence order, with its graph, cohort, estimate,
score, scale and execution class, and the measured duration of its completed frame; recording only
keeps references (nothing is formatted until read); the ring is bounded; the best rejected
alternative is the best other graph in the selection's own order (never above an ordinary winner);
prices are the highest first; names and classes given at admission appear in the cohort.
"""

from __future__ import annotations

import math

import pytest

import helios.runtime.decisions as decisions_module
from helios.config import SchedulerConfig
from helios.engine.echo_core import AffineCost
from helios.engine.sim_core import SimCore
from helios.prepare import ordinary_catalog
from helios.runtime.decisions import DecisionLog
from helios.scheduler import RequestSpec, Scheduler
from helios.sim.loop import Arrival, Simulation


def _sim(log: DecisionLog | None, requests: int = 12, slots: int = 8) -> Simulation:
    catalog = ordinary_catalog(max_batch=slots, prefill_chunks=(64, 256))
    sched = Scheduler(catalog, config=SchedulerConfig(request_slots=slots, kv_pages=4096))
    sched.seed_costs({shape: [AffineCost().duration_ns(shape, [])] for shape in catalog}, 0)
    sim = Simulation(sched, SimCore(catalog, AffineCost(), seed=0), decisions=log)
    sim.add([Arrival(i * 2_000_000, RequestSpec(40 + 37 * i, 6 + i % 5), output_len=6 + i % 5) for i in range(requests)])
    return sim


def test_every_committed_plan_is_recorded_once_in_fence_order_with_its_measured_duration():
    sim = _sim(DecisionLog(maxlen=16))
    sim.run()
    log = sim.decision_log
    assert len(log) == len(sim.steps) > 20  # drained as the ring filled: the whole run, nothing lost
    for d, step in zip(log, sim.steps):
        assert d["seq"] == step.fence
        assert d["graph"] == step.label
        assert [r["handle"] for r in d["cohort"]] == list(step.handles)
        assert d["estimated_ms"] == pytest.approx(step.estimated_ns / 1e6)
        assert d["measured_ms"] == pytest.approx(step.measured_ns / 1e6)
        assert d["value_rate"] == pytest.approx(step.value_rate)
        assert d["t"] == pytest.approx(step.start_ns / 1e9, abs=1e-3) or d["t"] <= step.start_ns / 1e9
        assert d["reason"] == "ordinary" and d["execution_class"] == "ordinary"  # every graph was measured


def test_the_best_rejected_alternative_never_outranks_an_ordinary_winner_and_prices_are_sorted():
    sim = _sim(DecisionLog(maxlen=64, top_prices=64, top_alternatives=8, always_detail=True))
    sim.run()
    with_alternatives = 0
    for d in sim.decision_log:
        graphs = [a["graph"] for a in d["alternatives"]]
        assert d["graph"] not in graphs and len(set(graphs)) == len(graphs)  # other graphs, one each
        rates = [a["value_rate"] for a in d["alternatives"]]
        assert rates == sorted(rates, reverse=True)
        if rates:
            with_alternatives += 1
            assert rates[0] <= d["value_rate"] * (1 + 1e-12) + 1e-12
        for group in ("waiting", "decoding"):
            prices = [r["price"] for r in d["prices"][group]]
            assert prices == sorted(prices, reverse=True)
            assert len(prices) == d["prices"][f"{group}_count"]  # top 64 holds them all here
        assert d["candidates"] >= 1 + len(d["alternatives"])
        # log10 of the unscaled rate: the scaled rate times e^log_scale
        assert d["value_rate_log10"] == pytest.approx(math.log10(d["value_rate"]) + d["log_scale"] / math.log(10))
    assert with_alternatives > 5


def test_an_alternative_names_the_requests_it_would_have_served():
    sim = _sim(DecisionLog(maxlen=64, top_alternatives=8, always_detail=True))
    sim.run()
    waiting_alternatives = [(d, a) for d in sim.decision_log for a in d["alternatives"] if a["kind"] == "prefill"]
    assert waiting_alternatives
    for d, a in waiting_alternatives:
        handles = {r["handle"] for r in a["cohort"]}
        assert len(handles) == a["cohort_size"]
        assert handles <= {r["handle"] for r in d["prices"]["waiting"]} | {r["handle"] for r in d["cohort"]} | handles
        assert handles & {r["handle"] for r in d["prices"]["waiting"]} or d["prices"]["waiting_count"] > 5


def test_recording_formats_nothing_until_read(monkeypatch):
    calls = []
    real = decisions_module.describe
    monkeypatch.setattr(decisions_module, "describe", lambda *a: calls.append(a[0]) or real(*a))
    log = DecisionLog(maxlen=8)
    sim = _sim(None)
    sim.loop.decisions = log  # the loop records; nobody reads
    sim.run(max_steps=30)
    assert calls == [] and log.recorded == 30 and log.pending == 8  # bounded: the last 8 only
    first = log.since(0)
    assert [d["seq"] for d in first] == list(range(23, 31)) and calls == list(range(23, 31))
    assert log.since(0) == first and len(calls) == 8  # formatted once, however often read
    assert [d["seq"] for d in log.since(28)] == [29, 30]
    assert [d["seq"] for d in log.since(0, limit=3)] == [28, 29, 30]


def test_names_and_classes_given_at_admission_appear_in_the_cohort():
    log = DecisionLog()
    catalog = ordinary_catalog(max_batch=4, prefill_chunks=(64,))
    sched = Scheduler(catalog, config=SchedulerConfig(request_slots=4, kv_pages=256))
    sim = Simulation(sched, SimCore(catalog, AffineCost(), seed=0))
    sim.loop.decisions = log  # recorded by the loop; named here, as the server's runtime does at submit
    sim.add([Arrival(0, RequestSpec(30, 3))])
    log.name(0, "chat-42", "interactive")
    sim.run()
    d = log.since(0)[0]
    assert d["cohort"][0] == {"handle": 0, "id": "chat-42", "class": "interactive", "prompt_tokens": 30,
                              "output_rows": 1, "expected_tokens": d["cohort"][0]["expected_tokens"],
                              "value": d["cohort"][0]["value"]}
    assert d["reason"] == "discovery" and d["estimated_ms"] is None  # nothing was measured yet


def test_alternatives_and_prices_are_kept_only_while_someone_reads(monkeypatch):
    """Nobody reading: the ring keeps each plan's fields only (no view or candidates kept alive).
    A read keeps the detail of the decisions of the next DETAIL_TTL_NS of scheduler time."""
    monkeypatch.setattr(decisions_module, "DETAIL_TTL_NS", 100_000_000)  # 0.1 s: within this short run
    log = DecisionLog(maxlen=512)
    sim = _sim(None, requests=40)
    sim.loop.decisions = log
    sim.run(max_steps=10)
    unread = log.since(0)
    assert all(d["prices"] is None and d["candidates"] is None for d in unread)  # recorded unread
    sim.run(max_steps=20)
    later = log.since(unread[-1]["seq"])
    assert later and all(d["prices"] is not None for d in later)  # the first read switched detail on
    sim.run()  # no read after that second one: once past the TTL, plans only again
    rest = log.since(later[-1]["seq"])
    ttl_end = rest[0]["t"] + decisions_module.DETAIL_TTL_NS / 1e9  # from the first decision after the read
    assert any(d["t"] > ttl_end for d in rest)
    assert all((d["prices"] is None) == (d["t"] > ttl_end) for d in rest if abs(d["t"] - ttl_end) > 0.005)


def test_a_log_holds_at_least_one_decision():
    with pytest.raises(ValueError):
        DecisionLog(maxlen=0)


def test_reasons_name_the_execution_class_or_the_prerequisite():
    from helios.graphs import GraphKind, GraphShape
    from helios.runtime.decision_format import reason_of
    from helios.runtime.decisions import Decided
    from helios.scheduler.plan import SelectionReason

    def reason(kind, why=SelectionReason.ORDINARY, private=False, anchor=False):
        shape = GraphShape(kind, 1, 64 if kind.is_prefill else 1)
        return reason_of(Decided(shape, None, 1, 1.0, 0.0, why, private, anchor))

    assert reason(GraphKind.DECODE) == "ordinary"
    assert reason(GraphKind.DECODE, SelectionReason.TIMING_REFRESH) == "timing_refresh"
    assert reason(GraphKind.DECODE, SelectionReason.ACCEPTANCE_LEARNING) == "acceptance_probe"
    assert reason(GraphKind.PREFILL, SelectionReason.DISCOVERY) == "discovery"
    assert reason(GraphKind.RESTORE) == "prerequisite"
    assert reason(GraphKind.SNAPSHOT, private=True) == "prerequisite"
    assert reason(GraphKind.SNAPSHOT, anchor=True) == "checkpoint"
    assert reason(GraphKind.SNAPSHOT) == "retirement"


def test_a_baseline_without_value_rates_still_logs_what_ran():
    from helios.baselines import make_scheduler

    catalog = ordinary_catalog(max_batch=4, prefill_chunks=(64,))
    sched = make_scheduler("vllm-fcfs", catalog, None, SchedulerConfig(request_slots=4, kv_pages=256))
    sim = Simulation(sched, SimCore(catalog, AffineCost(), seed=0), decisions=DecisionLog(always_detail=True))
    sim.add([Arrival(0, RequestSpec(30, 3)), Arrival(0, RequestSpec(50, 4))])
    sim.run()
    assert [d["graph"] for d in sim.decision_log] == [s.label for s in sim.steps]
    assert all(d["alternatives"] == [] and d["prices"] is None for d in sim.decision_log)

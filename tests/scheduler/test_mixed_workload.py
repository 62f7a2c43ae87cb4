"""Concurrent prompt/decode workloads and independent expiry of mixed shapes (spec:
"Verification": mixed tests; "Duration estimates": each physical shape is its own cost entry)."""

from helios.config import preset
from helios.graphs import GraphKind
from helios.scheduler.cost import CostState

from conftest import MS, Driver, FixedCosts, decode, make, preset_configs, spec
from mixed_helpers import mixed, small_mixed_catalog

MIXED = GraphKind.MIXED


catalog = small_mixed_catalog


def test_decoders_keep_being_served_while_a_long_prompt_is_prefilled():
    # The shipped preset (tau = 50 ms, what `flare run` uses). With the table's tau = 100 ms on
    # these 6-27 ms graphs the stall price grows half as fast, four chunks run alone first and
    # the stream a B=4 mixed graph leaves out waits 160 ms (docs/scheduling-utility.md, section 5).
    table = catalog()
    s = make(table, policy=preset_configs("balanced"))
    d = Driver(s, FixedCosts(table))
    streams = [s.admit(spec(prompt=64, out=120), 0) for _ in range(4)]
    d.run(8)  # the streams' prompts, then decoding
    assert all(s.request_row(h).phase.name == "DECODE" for h in streams)
    long = s.admit(spec(prompt=6000, out=4), s.now_ns)
    start = len(d.history)
    while s.is_live(long) and s.request_row(long).phase.name == "PREFILL":
        assert d.run_one() is not None
    during = [p for p, _, _ in d.history[start:]]
    prompt_plans = [p for p in during if long in p.handles]
    assert sum(p.lanes[p.handles.index(long)].prompt_tokens for p in prompt_plans) == 6000
    # Prices decide, not a rule: a prefill-only chunk would defer the four streams' step to a graph
    # of its own (the deferred step, docs/scheduling-utility.md section 4), so every chunk rides a
    # mixed graph with all of them (B=8, the smallest with room for four streams and the prompt row).
    mixed_chunks = [p for p in prompt_plans if p.shape.kind is MIXED]
    assert len(mixed_chunks) == len(prompt_plans) >= 3
    assert all(p.prefill_row == 0 and set(streams) <= set(p.handles) for p in mixed_chunks)
    # No stream waits longer than the spec's startup cadence (gaps < 150 ms) while the prompt is
    # consumed: the decoders' stall is priced, so prefill-only chunks cannot run on indefinitely.
    for h in streams:
        times = d.published[h]
        gaps = [b - a for a, b in zip(times, times[1:]) if a >= d.history[start][1]]
        assert max(gaps) < 150 * MS
    # No request is lost: everyone finishes, each with all its tokens.
    d.run(400)
    assert not any(s.is_live(h) for h in streams + [long])
    assert s.stats.by_shape and any(sh.kind is MIXED for sh in s.stats.by_shape)


def test_several_prompts_and_streams_all_finish():
    table = catalog()
    s = make(table)
    d = Driver(s, FixedCosts(table))
    handles = []
    for i in range(12):
        handles.append(s.admit(spec(prompt=50 + 400 * (i % 4), out=10 + 7 * (i % 3)), s.now_ns))
        d.run(3)
    d.run(600)
    assert not any(s.is_live(h) for h in handles)
    outputs = {}
    for p, _, _ in d.history:
        for lane in p.lanes:
            outputs[lane.handle] = outputs.get(lane.handle, 0) + lane.output_rows
    assert all(outputs[h] == 10 + 7 * (i % 3) for i, h in enumerate(handles))


def test_each_mixed_shape_expires_and_recovers_independently():
    table = {decode(2): 6.2, mixed(2, 64): 7.5, mixed(2, 256): 11.3}
    s = make(table, unmeasured=(mixed(2, 256),))
    ttl = s.policy.estimate_ttl_ns
    s.costs.observe(mixed(2, 256), int(11.3 * MS), 0)
    s.advance_to(ttl // 2)
    s.costs.observe(mixed(2, 64), int(7.5 * MS), s.now_ns)
    s.costs.observe(decode(2), int(6.2 * MS), s.now_ns)
    s.advance_to(ttl + MS)
    # Durations are keyed by the whole shape: only the unobserved capacity went stale.
    assert s.costs.state(mixed(2, 256), s.now_ns) is CostState.STALE
    assert s.costs.state(mixed(2, 64), s.now_ns) is CostState.FRESH
    # A stale mixed shape still ranks by its measured cost: a 200-token prompt picks it.
    h = s.admit(spec(prompt=200, out=3), s.now_ns)
    plan = s.plan()
    assert plan.shape == mixed(2, 256) and plan.stale_cost and plan.requires_feedback
    assert plan.estimated_duration_ns == int(11.3 * MS)
    d = Driver(s, FixedCosts({**table, mixed(2, 256): 12.0}))
    d.run_one()
    # The first observation of a stale entry replaces its estimate; the other entries are untouched.
    assert s.costs.state(mixed(2, 256), s.now_ns) is CostState.FRESH
    assert s.costs.estimate_ns(mixed(2, 256)) == 12 * MS and s.costs.estimate_ns(mixed(2, 64)) == int(7.5 * MS)
    d.run(20)
    assert not s.is_live(h)

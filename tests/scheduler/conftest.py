"""Hand-stepped helpers: measured synthetic catalogs and a manual driver on a virtual clock."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import strategies as st

from helios.config import PolicyConfig, SchedulerConfig, StudyConfig, preset, study_preset
from helios.engine.sim_core import SimCore
from helios.graphs import Catalog, GraphKind, GraphShape
from helios.runtime.driver import SyncDriver
from helios.scheduler import CompletionRecord, ExecutionTiming, FinishReason, RequestSpec, Scheduler

MS = 1_000_000


def decode(b):
    return GraphShape(GraphKind.DECODE, b)


def prefill(c, b=1):
    return GraphShape(GraphKind.PREFILL, b, c)


class FixedCosts:
    """A measured synthetic catalog: shape -> milliseconds. Also a SimCore cost model."""

    def __init__(self, table: dict):
        self.table = dict(table)

    def duration_ns(self, shape, context_lens=()):
        return int(self.table[shape] * MS)


# The `spec` preset: the spec's table as written, every study switch off. Tests written from the
# spec's text run under it (make's default).
SPEC_POLICY = preset("spec")
SPEC_STUDY = StudyConfig.spec()
# The study switches that PolicyConfig() held before issue 45 (priced stalls and the deferred step,
# f and g unscaled): what the tests of those extensions run under, with the table's coefficients.
PRICED = StudyConfig(fairness_time_scale=False)


def table_policy(**overrides) -> PolicyConfig:
    """The spec's table with some coefficients overridden."""
    return PolicyConfig(**{"adaptation_ms": SPEC_POLICY.adaptation_ms, **overrides})


class Configs(tuple):
    """A (PolicyConfig, StudyConfig) pair whose fields also read as attributes (the exhaustive
    scorers read coefficients and switches alike)."""

    def __getattr__(self, name):
        return getattr(self[1] if name in StudyConfig.__dataclass_fields__ else self[0], name)


def configs(**overrides) -> Configs:
    """(table_policy, PRICED) with `overrides` set on whichever of the two has the field."""
    study_fields = set(StudyConfig.__dataclass_fields__)
    return Configs((table_policy(**{k: v for k, v in overrides.items() if k not in study_fields}),
                    replace(PRICED, **{k: v for k, v in overrides.items() if k in study_fields})))


def preset_configs(name: str) -> Configs:
    """A preset's coefficients and study switches, as `flare run --scheduler-policy NAME` serves them."""
    return Configs((preset(name), study_preset(name)))


def make(table: dict, *, measured=True, policy=None, config=None, now=0, unmeasured=(), study=None) -> Scheduler:
    """Scheduler over `table`'s shapes; `measured` seeds every cost but `unmeasured` with one
    observation. `policy` may be a (PolicyConfig, StudyConfig) pair (`configs`); by default the
    spec preset (SPEC_POLICY, SPEC_STUDY), or the table's coefficients with `study`."""
    if isinstance(policy, tuple):
        policy, study = policy
    s = Scheduler(Catalog(table), policy or SPEC_POLICY, config or SchedulerConfig(), study=study or SPEC_STUDY)
    if measured:
        s.seed_costs({shape: [int(ms * MS)] for shape, ms in table.items() if shape not in unmeasured}, now)
    return s


def spec(prompt=64, out=16, **kw) -> RequestSpec:
    return RequestSpec(prompt, out, **kw)


def records_for(plan, eos=()):
    return [CompletionRecord(l.handle, l.epoch, l.prompt_tokens, (7,) * l.output_rows, l.handle in eos)
            for l in plan.lanes]


def step(s: Scheduler, plan, fence: int, ms: float | None = None, publish=True, eos=()):
    """Commit, advance the virtual clock by the graph's duration, complete and publish."""
    s.commit(plan, fence)
    dur = ms if ms is not None else (plan.estimated_duration_ns or MS) / MS
    s.advance_to(s.now_ns + int(dur * MS))
    out = s.complete(fence, records_for(plan, eos), ExecutionTiming((int(dur * MS),), wall_ns=int(dur * MS)))
    if publish:
        for g in out:
            if g.tokens:
                s.published_output(g.handle, fence)
    return out


class Driver:
    """Runs plan/commit/complete/publish in a loop on the virtual clock, one frame at a time."""

    def __init__(self, s: Scheduler, durations: FixedCosts | None = None):
        self.s = s
        self.durations = durations
        self.fence = 0
        self.history = []  # (plan, start_ns, end_ns)
        self.published = {}  # handle -> list of publication times

    def run_one(self, eos=()):
        plan = self.s.plan()
        if plan is None:
            return None
        self.fence = max(self.fence, self.s._last_fence or 0) + 1
        ms = self.durations.duration_ns(plan.shape) / MS if self.durations else None
        start = self.s.now_ns
        out = step(self.s, plan, self.fence, ms, eos=eos)
        self.history.append((plan, start, self.s.now_ns))
        for g in out:
            if g.tokens:
                self.published.setdefault(g.handle, []).append(self.s.now_ns)
        return plan

    def run(self, n, eos=()):
        plans = []
        for _ in range(n):
            p = self.run_one(eos)
            if p is None:
                break
            plans.append(p)
        return plans


# A synthetic request for the exhaustive selection tests: (decoding?, log token rate, log delivery
# rate, output age in ms, prompt tokens left: tails below, between and above the prompt capacities).
REQUEST_STATE = st.tuples(st.booleans(), st.floats(-6.0, 2.0), st.floats(-6.0, 2.0), st.integers(0, 400),
                          st.integers(1, 300))


def drain(s: Scheduler, fence: int = 0, eos=()):
    """Plan and complete one frame at a time until nothing is planned; returns (log, fence)."""
    log = []
    while (p := s.plan()) is not None:
        fence += 1
        log.append((p, step(s, p, fence, eos=eos)))
    return log, fence


def cancel_pick(d, handles, pick: int) -> None:
    """A random-operation test's cancel: the picked request, unless it already finished."""
    if handles:
        h = handles[pick % len(handles)]
        if d.requests[h].finish is None:
            d.cancel(h)


def assert_whole_outputs(d, handles, want: dict) -> None:
    """Every request of a random-operation test finished: cancelled, or with its whole output."""
    for h in handles:
        r = d.requests[h]
        assert r.finish is FinishReason.CANCELLED or (r.finish in (FinishReason.EOS, FinishReason.LENGTH)
                                                       and len(r.tokens) == want[h])


def assert_all_ended(sched: Scheduler, d, handles, slots: int) -> None:
    """After a driver ran out of work: no request lost or still live, every slot and page back."""
    assert all(d.requests[h].finish is not None for h in handles)  # no lost request
    assert not any(sched.is_live(h) for h in handles)
    assert sched.resources.free_slots == slots and sched.resources.free_pages == sched.resources.total_pages


def with_states(table: dict, states, policy) -> Scheduler:
    """A measured scheduler at t = 1 s holding one request per REQUEST_STATE, set directly in the table."""
    s = make(table, policy=policy)
    now = 1000 * MS
    s.advance_to(now)
    for decoding, lx, lz, age, left in states:
        h = s.admit(spec(prompt=left + 10, out=50), now)
        t, r = s.requests, s.requests.row(h)
        t.log_x[r] = lx
        if decoding:
            t.prompt_done[r] = t.prompt_tokens[r]
            t.log_z[r] = lz
            t.last_publication_ns[r], t.has_publication[r] = now - age * MS, True
        else:
            t.prompt_done[r] = 10
        t.update_phase([r])
    return s


def shift_log_x(s: Scheduler, handle, delta: float) -> None:
    """Move a request's observed log token rate (a request that waited, or was served, longer)."""
    s.publications.flush()
    s.requests.log_x[s.requests.row(handle)] += delta


def table_digest(t):
    """Every column, row object and the free list of a RequestTable."""
    columns = {name: value.tobytes() for name, value in vars(t).items() if isinstance(value, np.ndarray)}
    spec_states = [(c.means.tobytes(), c.weights.tobytes(), c.generated.tobytes(), c.has.tobytes())
                   for c in t.speculation._all()]
    return (sorted(columns.items()), repr(t.specs), repr(t.finish), spec_states, sorted(t.index.items()),
            list(t._free), t.capacity, t.turnover)


def digest(s: Scheduler):
    """Everything a completion may change, for 'state unchanged' assertions."""
    return (
        table_digest(s.requests),
        list(s.publications.reported),
        repr(s.speculation.acceptance_prior[s.source].means.tobytes()),
        s.queue.fences(),
        repr(sorted((k.label(), e.estimate_ns, tuple(e.samples), e.last_valid_ns) for k, e in s.costs._entries.items())),
        s.resources.free_slots, s.resources.free_pages,
        repr(s.stats.executions), repr(s.stats.nanoseconds),
    )


@pytest.fixture
def ms():
    return MS


def sim_driver(table: dict, seed: int = 0, slots: int = 2):
    """A scheduler with `table` measured, and a synchronous driver over SimCore on a clock that
    moves 1 ms per reading."""
    catalog = Catalog(table)
    core = SimCore(catalog, FixedCosts(table), seed=seed, request_slots=slots)
    sched = Scheduler(catalog, PolicyConfig(), SchedulerConfig(request_slots=slots))
    sched.seed_costs({sh: [int(ms * MS)] for sh, ms in table.items()}, 0)
    clock = itertools.count(0, MS)
    return sched, SyncDriver(sched, core, clock=lambda: next(clock))

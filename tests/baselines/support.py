"""Shared fixtures for the baseline tests: an affine cost model, workloads, hand stepping."""

from __future__ import annotations

import random

from helios.baselines import make_scheduler
from helios.config import SchedulerConfig
from helios.engine.sim_core import SimCore
from helios.graphs import GraphKind
from helios.prepare import ordinary_catalog
from helios.scheduler.plan import CompletionRecord, ExecutionTiming
from helios.scheduler.request_spec import RequestSpec
from helios.sim.loop import Arrival, Simulation

BASELINES = ("vllm-fcfs", "sarathi", "vtc", "direct", "vllm-priority", "edf")
ALL = ("helios",) + BASELINES
FCFS_PREFILL = ("vllm-fcfs", "sarathi", "direct")
# Decode at B = 1..16; prefill chunks 64/256/1024 with B x C <= 1024.
CATALOG = ordinary_catalog(max_batch=16, prefill_chunks=(64, 256, 1024))


class AffineCost:
    """decode ms = 7 + 0.08 B; prefill ms = 5 + 0.04 B C (padding is paid)."""

    def duration_ns(self, shape, context_lens) -> int:
        if shape.kind is GraphKind.DECODE:
            ms = 7 + 0.08 * shape.batch_capacity
        else:
            ms = 5 + 0.04 * shape.batch_capacity * shape.token_capacity
        return int(round(ms * 1e6))

    def packed_duration_ns(self, chunks, context_lens) -> int:
        """One varlen forward: 7 ms + 0.08 ms per decode row + 0.04 ms per prompt token (no padding)."""
        ms = 7 + sum(0.04 * c if c else 0.08 for c in chunks)
        return int(round(ms * 1e6))


def workload(n: int = 20, seed: int = 0, clients=("a", "b"), gap_ms: float = 15.0,
             prompt=(8, 1500), output=(1, 40)) -> list[Arrival]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        limit = rng.randint(*output)
        spec = RequestSpec(rng.randint(*prompt), limit, client=rng.choice(clients))
        out.append(Arrival(int(i * gap_ms * 1e6), spec, output_len=rng.randint(1, limit), client=spec.client))
    return out


def simulate(name: str, arrivals, config: SchedulerConfig | None = None, seed: int = 0, **options):
    sched = make_scheduler(name, CATALOG, None, config, **options)
    sim = Simulation(sched, SimCore(CATALOG, AffineCost(), seed=seed))
    sim.add(arrivals)
    sim.run()
    return sched, sim


def records(plan, token: int = 7) -> list[CompletionRecord]:
    return [CompletionRecord(l.handle, l.epoch, l.prompt_tokens, (token,) * l.output_rows) for l in plan.lanes]


def timing(ms: float = 10.0) -> ExecutionTiming:
    ns = int(ms * 1e6)
    return ExecutionTiming((ns,), None, ns)


class Stepper:
    """Hand-stepped driver: plan, commit and complete one frame at a time on a virtual clock."""

    def __init__(self, sched, step_ms: float = 10.0):
        self.sched = sched
        self.fence = 0
        self.now = 0
        self.step_ms = step_ms
        self.log = []  # (plan, runnable decode handles at planning time)

    def admit(self, spec: RequestSpec) -> int:
        return self.sched.admit(spec, self.now)

    def dispatch(self):
        plan = self.sched.plan()
        if plan is None:
            return None
        decodes = tuple(int(self.sched.requests.handle[r]) for r in self.sched.running_decodes()) if hasattr(self.sched, "running_decodes") else ()
        self.fence += 1
        self.sched.commit(plan, self.fence)
        self.log.append((plan, decodes))
        return plan, self.fence

    def finish(self, plan, fence):
        self.now += int(self.step_ms * 1e6)
        self.sched.advance_to(self.now)
        out = self.sched.complete(fence, records(plan), timing(self.step_ms))
        for g in out:
            if g.tokens:
                self.sched.published_output(g.handle, fence)
        return out

    def step(self):
        got = self.dispatch()
        if got is not None:
            self.finish(*got)
        return got

    def run(self, max_steps: int = 10_000):
        for _ in range(max_steps):
            if self.step() is None:
                return
        raise AssertionError("did not drain")

"""SimCore: a deterministic, seeded engine that executes plans against a cost model."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from helios.engine.core import CostModel, Execution
from helios.errors import HeliosError
from helios.graphs import Catalog
from helios.scheduler.plan import CompletionRecord, ExecutionTiming, Fence, RequestHandle, ScheduledPlan


class CoreFault(HeliosError):
    """An injected engine failure."""


@dataclass(slots=True)
class SimFaults:
    """Timing faults on demand: probabilities per frame, and fences that raise."""

    missing_timing: float = 0.0  # every rank reports None
    zero_timing: float = 0.0  # every rank reports 0
    raise_on: set = field(default_factory=set)


@dataclass(slots=True)
class _SimRequest:
    output_len: int | None  # EOS after this many tokens; None: only limits stop it
    emitted: int = 0


class SimCore:
    """Executes plans with durations from `cost_model`, multiplicative timing noise,
    N-rank intervals, an optional exposed readiness delay, and injected faults."""

    def __init__(self, catalog: Catalog, cost_model: CostModel, *, seed: int = 0, noise: float = 0.0,
                 ranks: int = 1, readiness_ns: int = 0, host_overhead_ns: int = 0,
                 faults: SimFaults | None = None, vocab: int = 32000, eos_id: int = 0):
        if ranks < 1:
            raise ValueError("ranks must be at least 1")
        self.catalog = catalog
        self.cost_model = cost_model
        self.noise = noise
        self.ranks = ranks
        self.readiness_ns = readiness_ns
        self.host_overhead_ns = host_overhead_ns
        self.faults = faults or SimFaults()
        self.vocab = vocab
        self.eos_id = eos_id
        self._rng = np.random.default_rng(seed)
        self._requests: dict[RequestHandle, _SimRequest] = {}

    def attach(self, handle: RequestHandle, prompt: Sequence[int] | int = 0, *, output_len: int | None = None,
               **_options) -> None:
        self._requests[handle] = _SimRequest(output_len)

    def detach(self, handle: RequestHandle) -> None:
        self._requests.pop(handle, None)

    def true_duration_ns(self, plan: ScheduledPlan) -> int:
        base = self.cost_model.duration_ns(plan.shape, [lane.context_tokens for lane in plan.lanes])
        factor = 1.0 + self.noise * float(self._rng.standard_normal()) if self.noise else 1.0
        return max(1, int(base * max(0.2, factor)))

    def execute(self, plan: ScheduledPlan, fence: Fence) -> Execution:
        if fence in self.faults.raise_on:
            raise CoreFault(f"injected fault at fence {fence}")
        duration = self.true_duration_ns(plan)
        records = []
        for lane in plan.lanes:
            state = self._requests.setdefault(lane.handle, _SimRequest(None))
            tokens = []
            eos = False
            for _ in range(lane.output_rows):
                state.emitted += 1
                if state.output_len is not None and state.emitted >= state.output_len:
                    tokens.append(self.eos_id)
                    eos = True
                    break
                tokens.append(int(self._rng.integers(1, self.vocab)))
            records.append(CompletionRecord(lane.handle, lane.epoch, lane.prompt_tokens, tuple(tokens), eos))
        return Execution(tuple(records), self._timing(duration), duration)

    def _timing(self, duration: int) -> ExecutionTiming:
        u = float(self._rng.random())
        if u < self.faults.missing_timing:
            intervals = (None,) * self.ranks
        elif u < self.faults.missing_timing + self.faults.zero_timing:
            intervals = (0,) * self.ranks
        else:
            # Ranks finish within a small spread; the slowest one bounds the graph.
            jitter = 1.0 - 0.01 * self._rng.random(self.ranks)
            jitter[0] = 1.0
            intervals = tuple(int(duration * j) + self.readiness_ns for j in jitter)
        return ExecutionTiming(intervals, self.readiness_ns or None, duration + self.readiness_ns + self.host_overhead_ns)

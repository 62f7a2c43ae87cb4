"""SimCore: a deterministic, seeded engine that executes plans against a cost model.

Besides the prepared catalog it runs packed varlen forwards (GraphKind.PACKED), the way the baseline
engines (vLLM, Sarathi-Serve) run an iteration, when the cost model can price them.

Mixed graphs (the spec's "Mixed execution contract"): each prompt row (`plan.prefill_rows`: one in the
spec's form, up to the shape's `prompt_rows` packed in its prompt capacity) consumes its chunk and samples
one first token when the chunk ends its prompt; the other rows decode one token, or
run copy-speculative verification like a speculative round when the shape has proposals."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from helios.engine.core import ChunkedCostModel, CostModel, Execution, PackedCostModel
from helios.errors import ConfigError, HeliosError
from helios.graphs import Catalog, GraphKind
from helios.scheduler.plan import CompletionRecord, ExecutionTiming, Fence, RequestHandle, ScheduledPlan
from helios.scheduler.rounds import device_allocate


class CoreFault(HeliosError):
    """An injected engine failure."""


@dataclass(slots=True)
class SimFaults:
    """Faults on demand: timing faults as probabilities per frame, and frames that raise
    (listed fences, every Nth fence, or each frame with a probability)."""

    missing_timing: float = 0.0  # every rank reports None
    zero_timing: float = 0.0  # every rank reports 0
    rank_disagreement: float = 0.0  # one rank past rank 0 reports None, 0 or 2-10x the others
    raise_on: set = field(default_factory=set)
    raise_every: int | None = None  # fences divisible by this raise
    raise_rate: float = 0.0  # each frame raises with this probability

    def raises(self, fence: Fence, rng: np.random.Generator) -> bool:
        # Draw only when a rate is set, so other seeded streams are unchanged without one.
        return (fence in self.raise_on or (self.raise_every is not None and fence % self.raise_every == 0)
                or (self.raise_rate > 0.0 and float(rng.random()) < self.raise_rate))


@dataclass(slots=True)
class _SimRequest:
    output_len: int | None  # EOS after this many tokens; None: only limits stop it
    emitted: int = 0


class SimCore:
    """Executes plans with durations from `cost_model`, multiplicative timing noise,
    N-rank intervals, an optional exposed readiness delay, and injected faults."""

    def __init__(self, catalog: Catalog, cost_model: CostModel, *, seed: int = 0, noise: float = 0.0,
                 ranks: int = 1, readiness_ns: int = 0, host_overhead_ns: int = 0,
                 faults: SimFaults | None = None, vocab: int = 32000, eos_id: int = 0,
                 acceptance=None, request_slots: int = 64, draft_capacity: int = 8,
                 confidence_noise: float = 0.05, paired_acceptance: bool = False):
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
        # `acceptance` offers conditional(request_key, depth) -> per-position acceptance rates.
        self.acceptance = acceptance
        self.sidecar_shape = (2, request_slots, draft_capacity)
        self.confidence_noise = confidence_noise
        self._rng = np.random.default_rng(seed)
        self._fault_rng = np.random.default_rng([seed, 1])  # its own stream: faults never shift tokens
        self._requests: dict[RequestHandle, _SimRequest] = {}
        # Paired acceptance: each request's draft at output position i is accepted when its own
        # uniform u[i] falls below the conditional rate, so runs that schedule the same requests
        # differently see the same luck (common random numbers for width comparisons).
        self.paired_acceptance = paired_acceptance
        self._seed = seed
        self._draws: dict[RequestHandle, np.ndarray] = {}

    def attach(self, handle: RequestHandle, prompt: Sequence[int] | int = 0, *, output_len: int | None = None,
               **_options) -> None:
        self._requests[handle] = _SimRequest(output_len)

    def detach(self, handle: RequestHandle) -> None:
        self._requests.pop(handle, None)

    def true_duration_ns(self, plan: ScheduledPlan) -> int:
        contexts = plan.lanes.context_tokens.tolist()
        if plan.shape.kind is GraphKind.PACKED:
            # A varlen forward has no physical shape: its lanes are the work (prompt chunks, decodes).
            if not isinstance(self.cost_model, PackedCostModel):
                raise ConfigError("cost_model", "this cost model cannot price a packed forward")
            base = self.cost_model.packed_duration_ns(plan.lanes.prompt_tokens.tolist(), contexts)
        elif (plan.shape.kind.is_prefill or plan.shape.kind is GraphKind.MIXED) and isinstance(
                self.cost_model, ChunkedCostModel):
            # Packed prefill rows pay their own tokens; a mixed graph's prompt row is told from its decoders.
            base = self.cost_model.chunked_duration_ns(plan.shape, plan.lanes.prompt_tokens.tolist(), contexts)
        else:
            base = self.cost_model.duration_ns(plan.shape, contexts)
        factor = 1.0 + self.noise * float(self._rng.standard_normal()) if self.noise else 1.0
        return max(1, int(base * max(0.2, factor)))

    def execute(self, plan: ScheduledPlan, fence: Fence) -> Execution:
        if self.faults.raises(fence, self._fault_rng):
            raise CoreFault(f"injected fault at fence {fence}")
        duration = self.true_duration_ns(plan)
        if plan.shape.kind is GraphKind.SPECULATIVE:
            return self._round(plan, duration)
        if plan.shape.kind is GraphKind.MIXED and plan.shape.proposal_depth:
            return self._mixed_round(plan, duration)
        records = []
        for lane in plan.lanes:
            state = self._requests.setdefault(lane.handle, _SimRequest(None))
            tokens, eos = self._emit(state, lane.output_rows)
            records.append(CompletionRecord(lane.handle, lane.epoch, lane.prompt_tokens, tokens, eos))
        return Execution(tuple(records), self._timing(duration), duration)

    def _emit(self, state: _SimRequest, count: int) -> tuple[tuple[int, ...], bool]:
        tokens = []
        for _ in range(count):
            state.emitted += 1
            if state.output_len is not None and state.emitted >= state.output_len:
                tokens.append(self.eos_id)
                return tuple(tokens), True
            tokens.append(int(self._rng.integers(1, self.vocab)))
        return tuple(tokens), False

    def _round(self, plan: ScheduledPlan, duration: int) -> Execution:
        """A complete speculative program: proposals, confidence, allocation, verification, commit."""
        records, sidecar = self._speculate(plan, list(plan.lanes))
        return Execution(tuple(records), self._timing(duration), duration, confidence=sidecar)

    def _mixed_round(self, plan: ScheduledPlan, duration: int) -> Execution:
        """A speculative mixed graph: each prompt row consumes its chunk (and samples a first token when
        it finishes the prompt), the decode rows verify like a speculative round's lanes."""
        rows = plan.prefill_rows
        lanes = list(plan.lanes)
        decoders = [lane for i, lane in enumerate(lanes) if i not in rows]
        spec, _ = self._speculate(plan, decoders) if decoders else ([], None)
        records = iter(spec)
        out = []
        for i, lane in enumerate(lanes):
            if i in rows:
                state = self._requests.setdefault(lane.handle, _SimRequest(None))
                tokens, eos = self._emit(state, lane.output_rows)
                out.append(CompletionRecord(lane.handle, lane.epoch, lane.prompt_tokens, tokens, eos))
            else:
                out.append(next(records))
        return Execution(tuple(out), self._timing(duration), duration)

    def _speculate(self, plan: ScheduledPlan, lanes: list) -> tuple[list[CompletionRecord], np.ndarray | None]:
        depth = plan.shape.proposal_depth
        cond, joint = [], []
        for lane in lanes:
            # Asked at every width, one included: an acceptance that changes mid-stream counts rounds.
            c = (self.acceptance.conditional(lane.handle, depth) if self.acceptance is not None
                 else np.full(depth, 0.5))
            cond.append(np.asarray(c, dtype=float)[:depth])
            # The device's confidence is a noisy view of the true acceptance, causal by construction.
            p = np.clip(cond[-1] + self.confidence_noise * self._rng.standard_normal(depth), 0.0, 1.0)
            joint.append(np.cumprod(p))
        ceilings = [lane.output_rows for lane in lanes]
        if plan.device_allocation:
            slots = [lane.slot if lane.slot is not None else i for i, lane in enumerate(lanes)]
            rows = device_allocate(joint, ceilings, slots, plan.shape.target_capacity)
        else:
            rows = ceilings
        records = []
        for lane, r, c in zip(lanes, rows, cond):
            state = self._requests.setdefault(lane.handle, _SimRequest(None))
            u = self._paired(lane.handle, state.emitted, r - 1) if self.paired_acceptance else None
            accepted = 0
            while accepted < r - 1 and (u[accepted] if u is not None else self._rng.random()) < c[accepted]:
                accepted += 1
            tokens, eos = self._emit(state, accepted + 1)  # accepted drafts plus one bonus/replacement
            records.append(CompletionRecord(lane.handle, lane.epoch, 0, tokens, eos,
                                            offered=r - 1 if plan.device_allocation else None))
        sidecar = None
        if plan.device_allocation:
            sidecar = np.zeros(self.sidecar_shape, dtype=np.float32)
            for lane, j in zip(lanes, joint):
                if lane.slot is not None:
                    prev = np.concatenate([[1.0], j[:-1]])
                    sidecar[0, lane.slot, :depth] = np.divide(j, prev, out=np.zeros_like(j), where=prev > 0)
                    sidecar[1, lane.slot, :depth] = j
        return records, sidecar

    def _paired(self, handle: RequestHandle, start: int, n: int) -> np.ndarray:
        draws = self._draws.get(handle)
        if draws is None or len(draws) < start + n:
            rng = np.random.default_rng([self._seed, 2, handle])
            draws = self._draws[handle] = rng.random(max(2 * (start + n), 1024))
        return draws[start:start + n]

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
            if self.ranks > 1 and float(self._fault_rng.random()) < self.faults.rank_disagreement:
                rank = int(self._fault_rng.integers(1, self.ranks))
                odd = (None, 0, int(intervals[rank] * self._fault_rng.uniform(2.0, 10.0)))
                intervals = intervals[:rank] + (odd[int(self._fault_rng.integers(3))],) + intervals[rank + 1:]
        return ExecutionTiming(intervals, self.readiness_ns or None, duration + self.readiness_ns + self.host_overhead_ns)


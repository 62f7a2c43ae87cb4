"""The Helios scheduler: admit, cancel, advance_to, plan, commit, complete, published_output."""

from __future__ import annotations

import math
from collections import deque

import numpy as np

from helios.config import PolicyConfig, SchedulerConfig, SpeculationMode, StudyConfig
from helios.errors import InvalidRequest, UnknownRequest, HeliosError
from helios.graphs import Catalog, GraphKind
import helios.scheduler.execution as execution
import helios.scheduler.selection as selection
from helios.scheduler.class_prices import class_prices
from helios.scheduler.accounting import Publications
from helios.scheduler.completion import ExecutionStats
from helios.scheduler.cost import CostTable
from helios.scheduler.estimates import Estimates
from helios.scheduler.exploration import Exploration
from helios.scheduler.plan import (
    NO_SLOT, ExecutionTiming, Fence, FinishReason, GeneratedToken, RequestHandle, ScheduledPlan,
)
from helios.scheduler.request_spec import RequestSpec
from helios.scheduler.protocol import SchedulerSnapshot
from helios.scheduler.preemption import due as preemption_due
from helios.scheduler.requests import DONE, RequestRow, RequestTable
from helios.scheduler.resources import ResourcePool
from helios.scheduler.service import Normalizers, PriceCoefficients
from helios.scheduler.memo import Memo
from helios.scheduler.prerequisite import Built
from helios.scheduler.prerequisite_kinds import Prerequisites
from helios.scheduler.shapes import ShapeSets
from helios.scheduler.slot_share import current_shares
from helios.scheduler.speculation import ProposalSource, SpeculationModel
from helios.scheduler.tracelog import TraceLog
from helios.scheduler.utility import DecodeReference
from helios.scheduler.queue import ExecutionQueue

RETIRED_MEMORY = 4096


class Scheduler:
    """Selects prepared graphs by expected useful value per execution time.

    Pure: no I/O and no clock; time only arrives through `admit`, `cancel` and `advance_to`.
    """

    mixed_graphs = True  # selects the catalog's mixed graphs (baselines never do)
    # Snapshot and restore graphs are planned by value per time (prerequisites.py); a selector
    # that never plans them (a baseline) must not hold terminal captures or await restores.
    plans_state_operations = True

    def __init__(self, catalog: Catalog, policy: PolicyConfig | None = None,
                 config: SchedulerConfig | None = None, costs: CostTable | None = None,
                 study: StudyConfig | None = None):
        self.catalog = catalog
        self.policy = policy or PolicyConfig()  # the operator's coefficients
        self.study = study or StudyConfig()  # the switches beyond the spec's table
        self.config = config or SchedulerConfig()
        self.costs = costs or CostTable(self.policy.estimate_ttl_ns)
        self.coeff = PriceCoefficients.of(self.policy)
        spec_on = self.config.speculation is not SpeculationMode.OFF
        self.resources = ResourcePool(self.config.request_slots, self.config.kv_pages,
                                      self.config.page_tokens, self.config.max_context,
                                      self.config.draft_capacity if spec_on else 0)
        self.queue = ExecutionQueue(self.config.frame_slots)
        self.requests = RequestTable(self.config.draft_capacity)
        self.memo = Memo()  # static derived values, kept by identity (memo.py)
        self.publications = Publications(self.requests, self.policy.adaptation_ms, self.memo.decay)
        self.stats = ExecutionStats()
        self.exploration = Exploration(self.config.funded_exploration)  # timing refresh, acceptance learning
        self.traces = TraceLog(4096, self.exploration.refresh.den, self.exploration.learning.den)
        # (plan, view, candidates, chosen) of the last selection.plan call: references, never copied.
        self.last_selection: tuple | None = None
        self.now_ns = 0
        self._next_handle = 0
        self.marks = execution.Marks()  # the table's stamp, decisions, last fence, last bursts
        self._retired: deque[RequestHandle] = deque(maxlen=RETIRED_MEMORY)
        self._retired_set: set[RequestHandle] = set()
        self.shapes = ShapeSets.of(catalog, spec_on, self.mixed_graphs)
        self.estimates = Estimates(self.costs, self.shapes, self.study, self.coeff)  # estimates.py
        # State-row reservation (draft_capacity) covers the widest verification of the separate
        # and the mixed catalogs.
        if self.shapes.max_verification_width - 1 > self.config.draft_capacity or any(
                sh.proposal_depth > self.config.draft_capacity for sh in self.shapes.speculative + self.shapes.mixed):
            raise InvalidRequest("a speculative or mixed program's depth exceeds draft_capacity")
        self.speculation = SpeculationModel(self.config.draft_capacity, self.study.acceptance_estimate)
        self.source = ProposalSource.COPY if self.config.copy_proposals else ProposalSource.LEARNED
        # Prerequisite work (prerequisite_kinds.py): state operations, vision windows, anchor cuts.
        self.prereqs = Prerequisites(Built(catalog, self.policy, self.config, self.shapes,
                                           self.plans_state_operations, {}))
        kinds = self.prereqs.kinds
        self.state = kinds["state"].ops  # restores, captures (checkpoints.py)
        self.vision = kinds["vision"].windows  # image windows (vision.py)
        self.anchors = kinds["anchors"].cuts  # extra prefill cuts (anchors.py)
        self.selection = selection.SelectionInputs(  # what plan() reads
            self.requests, self.resources, self.queue, self.publications, self.prereqs, self.costs, self.estimates,
            self.shapes, self.policy, self.study, self.config, self.speculation, self.source, self.memo,
            self.exploration)
        self.execution = execution.ExecutionInputs(  # what commit, complete* and published_outputs read
            self.requests, self.resources, self.queue, self.publications, self.prereqs, self.costs, self.estimates,
            self.exploration, self.traces, self.stats, self.config, self.policy, self.study, self.memo,
            self.speculation, self.source, self.marks, self._retire_idle, self._retired_set)

    # The marks, by their former names (tests, baselines).
    _stamp = property(lambda self: self.marks.stamp)
    _last_fence = property(lambda self: self.marks.last_fence)
    _bursts = property(lambda self: self.marks.bursts)

    # ---- time and requests -------------------------------------------------------------
    def advance_to(self, now_ns: int) -> None:
        if not isinstance(now_ns, int) or now_ns < self.now_ns:
            raise HeliosError(f"time must be a nondecreasing integer: {now_ns!r} < {self.now_ns}")
        self.now_ns = now_ns

    def admit(self, request: RequestSpec, now_ns: int) -> RequestHandle:
        self.advance_to(now_ns)
        self.publications.flush()
        if request.prompt_tokens + 1 > self.config.max_context:
            raise InvalidRequest(f"prompt of {request.prompt_tokens} tokens leaves no room in a "
                                 f"{self.config.max_context}-token context")
        if request.score_prompt and not self.shapes.scored_prefill:
            raise InvalidRequest("prompt scoring needs scored-prefill graphs, and none is loaded")
        if not request.score_prompt and not self.shapes.prefill and not self.shapes.mixed:
            # Legal catalog (e.g. decode only), but nothing could consume this prompt.
            raise InvalidRequest("the catalog has no prefill graph to consume the prompt")
        if self.resources.extent_pages(request) > self.resources.total_pages:
            raise InvalidRequest("the request's context extent exceeds the KV page pool")
        checked = self.prereqs.check(request, lambda: self._max_chunk(request))
        self.marks.stamp += 1  # validated: the table changes
        handle = self._next_handle
        self._next_handle += 1
        # Its class changes its prices, not its queue (class_prices.py); the default class is priced
        # with the policy's coefficients.
        prices = class_prices(request.service_class, self.policy, request.prompt_tokens,
                              request.max_output_tokens, request.tenant_weight)
        # With the mean-rate law, the starting rate counts as one adaptation time of history: the
        # class's prompt-phase time (the policy's for the default class), so a waiting prompt's price
        # grows as 1 + W / tau_wait, the class's own fraction of its target.
        window = prices.wait_tau_ms if self.study.prompt_rate_law.mean_law else None
        self.requests.add(handle, request, self._starting_log_rate(), window, prices, self.policy.adaptation_ms)
        self.prereqs.admitted(handle, request, checked, self.costs.estimate_ns)
        return handle

    def _max_chunk(self, request: RequestSpec) -> int:
        """The most prompt tokens one chunk of this request's prefill kind can take."""
        if request.score_prompt:
            return max((s.token_capacity for s in self.shapes.scored_prefill), default=0)
        return max([s.token_capacity for s in self.shapes.prefill] + [s.prefill_capacity for s in self.shapes.mixed])

    def _starting_log_rate(self) -> float:
        # A new request starts at the mean token rate of the live requests, so equal
        # histories mean equal prices and a newcomer is neither favoured nor starved.
        rates = self.requests.log_x[self.requests.live_rows()]
        if len(rates):
            return float(np.logaddexp.reduce(rates) - math.log(len(rates)))
        if self.study.phase_normalized:
            # With no live request: the rate of a stream alone on the machine, one output token
            # per fastest measured delivery graph (1 token/ms before anything is measured).
            return self._normalizers().log_decode
        measured = [t for s, t in self.costs.measured().items() if s.kind is GraphKind.DECODE]
        # Physical rates: one token per fastest measured decode, else 1 token/ms.
        return -math.log(min(measured) / 1e6) if measured else 0.0

    def cancel(self, handle: RequestHandle, now_ns: int, reason: FinishReason = FinishReason.CANCELLED) -> None:
        """Stop selecting the request now; its slot and pages stay owned through its last fence."""
        self.advance_to(now_ns)
        self.publications.flush()
        t = self.requests
        row = t.row(handle)
        if row is None:
            if handle in self._retired_set:
                return  # cancelling a finished request is a no-op
            raise UnknownRequest(f"unknown request handle {handle}")
        if t.phase[row] == DONE:
            return
        self.marks.stamp += 1
        t.cancelled[row] = True
        t.set_finish(row, reason)
        t.update_phase([row])
        t.rebind(row)
        self.prereqs.forget(handle)
        self._retire_idle([row])

    def _retire_idle(self, rows) -> None:
        t = self.requests
        rows = np.asarray(rows, dtype=np.int64)
        for row in rows[(t.phase[rows] == DONE) & (t.inflight[rows] == 0)].tolist():
            handle = int(t.handle[row])
            if self.prereqs.holds(handle):
                continue  # e.g. a terminal capture retires through its snapshot
            self.prereqs.retired(handle)  # e.g. its private window snapshot row
            self.resources.release(t, row)
            t.remove(row)
            if len(self._retired) == self._retired.maxlen:
                self._retired_set.discard(self._retired[0])
            self._retired.append(handle)
            self._retired_set.add(handle)

    def request_row(self, handle: RequestHandle) -> RequestRow:
        """A read-only copy of one request's state (tests, debugging)."""
        self.publications.flush()
        return self.requests[handle]

    # ---- planning (selection.py) -------------------------------------------------------
    def plan(self) -> ScheduledPlan | None:
        plan, detail = selection.plan(self.selection, self.now_ns, self.marks.stamp)
        self.last_selection = None if detail is None else (plan, *detail)
        return plan

    def selection_detail(self, plan: ScheduledPlan) -> tuple | None:
        """(planning view, evaluated candidates, chosen candidate) of the plan() call that returned
        `plan`, or None (another call since, or a selector without value rates). Read-only
        references for the decision log (helios.runtime.decisions): nothing is copied or computed."""
        last = self.last_selection
        return last[1:] if last is not None and last[0] is plan else None

    # Accessors of the estimates-only values (estimates.py), cached against the cost table.
    def _normalizers(self) -> Normalizers:
        """The phases' reference rates from the measured catalog (docs/scheduling-utility.md)."""
        return self.estimates.get()[1]

    def _decode_reference(self) -> DecodeReference:
        return self.estimates.get()[0]

    def _coeff(self) -> PriceCoefficients:
        """The price coefficients, calibrated to the measured time scale when the policy asks."""
        return self.estimates.get()[2]

    def seed_acceptance(self, survival, source: ProposalSource | None = None) -> None:
        """Preseed the population acceptance prior (prefix survival by depth)."""
        self.speculation.acceptance_prior[source or self.source].seed(survival)

    # ---- commit and completion (execution.py) ------------------------------------------
    def commit(self, plan: ScheduledPlan, fence: Fence) -> None:
        execution.commit(self.execution, plan, fence, self.now_ns)

    def complete(self, fence: Fence, records, timing: ExecutionTiming) -> list[GeneratedToken]:
        """Validate every lane first; a bad completion raises and changes nothing."""
        return execution.complete(self.execution, fence, records, timing, None, None, self.now_ns)

    def complete_with_survival(self, fence: Fence, records, timing: ExecutionTiming, survival) -> list[GeneratedToken]:
        """As complete(); `survival` maps handles to completion_speculative_survival rows."""
        return execution.complete(self.execution, fence, records, timing, None, survival, self.now_ns)

    def complete_packed_round(self, fence: Fence, records, timing: ExecutionTiming, confidence) -> list[GeneratedToken]:
        """Complete a device-allocated round with its FP32 [2, slots, draft_capacity] sidecar
        (or one per rank, rank 0 first; rank 0 drives host decisions)."""
        return execution.complete(self.execution, fence, records, timing, confidence, None, self.now_ns)

    def complete_packed_round_with_survival(self, fence: Fence, records, timing: ExecutionTiming,
                                            confidence, survival) -> list[GeneratedToken]:
        return execution.complete(self.execution, fence, records, timing, confidence, survival, self.now_ns)

    def sidecar_shape(self) -> tuple[int, int, int]:
        return (2, self.config.request_slots, self.config.draft_capacity)

    # ---- the caller surface beyond the spec's API (see protocol.py) ------------------------
    def preempt(self, handle: RequestHandle, now_ns: int) -> None:
        """Retire a resident decoding request through a snapshot without completing its
        response; it resumes by restore, with the same tokens as an uninterrupted run."""
        self.advance_to(now_ns)
        self.publications.flush()
        self.state.preempt(self.requests, handle, now_ns)
        self.marks.stamp += 1

    @property
    def preempts(self) -> bool:
        """Whether the automatic preemption policy can act (its config and snapshot/restore graphs)."""
        return self.config.preemption.enabled and self.state.enabled

    def preempt_due(self, now_ns: int) -> list[RequestHandle]:
        """Preempt what the automatic policy (preemption.py) names at `now_ns`; returns the handles.
        The step loop calls it before planning."""
        self.advance_to(now_ns)
        if not self.preempts:
            return []
        self.publications.flush()
        shares = current_shares(self.requests, self.state.captures, self.memo) \
            if self.config.slot_share else None  # a client's share of the slots (slot_share.py)
        pairs = preemption_due(self.requests, self.resources, self.state, self.config.preemption, now_ns,
                               self.config.max_context, self._preemption_excluded(), shares)  # releases started waiters' holds
        for victim, waiter in pairs:
            self.preempt(victim, now_ns)
            self.state.held[victim] = waiter  # its restore waits until the waiter has started
        return [victim for victim, _ in pairs]

    def _preemption_excluded(self) -> set[RequestHandle]:
        # Image requests with window operations, and requests whose anchor snapshot is due (their
        # state copy is in progress), are neither preempted nor served by the policy.
        return self.prereqs.excluded()

    def restores_checkpoints(self) -> bool:
        """Whether admission may carry `cached_tokens` that a RESTORE graph must bring back
        (the catalog holds SNAPSHOT and RESTORE graphs)."""
        return self.state.enabled

    def is_live(self, handle: RequestHandle) -> bool:
        return handle in self.requests

    def snapshot(self) -> SchedulerSnapshot:
        t = self.requests
        live = t.phase != DONE
        running = int((live & (t.slot != NO_SLOT)).sum())
        s = self.stats
        return SchedulerSnapshot(
            self.now_ns, running, int(live.sum()) - running,
            self.resources.free_slots, self.resources.total_slots,
            self.resources.free_pages, self.resources.total_pages, len(self.queue),
            {k.value: v for k, v in s.nanoseconds.items()}, {k.value: v for k, v in s.executions.items()},
            dict(s.by_shape),
            {sh: est for sh in self.catalog if (est := self.costs.estimate_ns(sh)) is not None},
            {"programs": s.speculative_programs, "offered": s.speculative_offered,
             "accepted": s.speculative_accepted, "emitted": s.speculative_emitted,
             "learned_draws": s.speculative_learned_draws},
            tuple(self.speculation.acceptance_prior[self.source].means.tolist()))

    def seed_costs(self, samples, now_ns: int) -> None:
        self.advance_to(now_ns)
        for shape, values in samples.items():
            if shape not in self.catalog:
                raise HeliosError(f"cannot seed a cost for {shape.label()}: not in the catalog")
            for ns in values:
                self.costs.observe(shape, ns, now_ns)

    def published_output(self, handle: RequestHandle, fence: Fence) -> None:
        """Output of `fence` for `handle` reached the client: resets its output age, and turns
        that frame's zero delivery into one (applied before the table is next read)."""
        self.published_outputs((handle,), fence)

    def published_outputs(self, handles, fence: Fence) -> None:
        """`published_output(h, fence)` for each of `handles`, in order, in one call: a frame's
        bursts are usually published together. Checked before anything is recorded: an unknown
        handle raises and records none of them (a retired one is skipped, as alone)."""
        execution.publish(self.execution, handles, fence, self.now_ns)

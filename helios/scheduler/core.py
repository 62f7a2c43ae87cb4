"""The Helios scheduler: admit, cancel, advance_to, plan, commit, complete, published_output."""

from __future__ import annotations

import math
from collections import deque

import numpy as np

from helios.config import PolicyConfig, SchedulerConfig, SpeculationMode
from helios.errors import InvalidRequest, QueueFull, StalePlan, UnknownRequest, HeliosError
from helios.graphs import Catalog, GraphKind
from helios.scheduler.accounting import ExecutionStats, apply_completion, validate_completion
from helios.scheduler.cost import CostState, CostTable
from helios.scheduler.plan import (
    ExecutionTiming, Fence, FinishReason, GeneratedToken, Lane, PlanTrace,
    RequestHandle, RequestSpec, ScheduledPlan, SelectionReason,
)
from helios.scheduler.planning import PlanningView, build_view
from helios.scheduler.protocol import SchedulerSnapshot
from helios.scheduler.policy import Budget, best, decode_candidates, prefill_candidates
from helios.scheduler.rounds import speculative_candidates
from helios.scheduler.speculation import ProposalSource, SpeculationModel, expected_output
from helios.scheduler.queue import ExecutionQueue, Frame
from helios.scheduler.requests import Phase, Request, ResourcePool
from helios.scheduler.service import PriceCoefficients, ServiceHistory, ewma_log

RETIRED_MEMORY = 4096


class Scheduler:
    """Selects prepared graphs by expected useful value per execution time.

    Pure: no I/O and no clock; time only arrives through `admit`, `cancel` and `advance_to`.
    """

    def __init__(self, catalog: Catalog, policy: PolicyConfig | None = None,
                 config: SchedulerConfig | None = None, costs: CostTable | None = None):
        self.catalog = catalog
        self.policy = policy or PolicyConfig()
        self.config = config or SchedulerConfig()
        self.costs = costs or CostTable(self.policy.estimate_ttl_ns)
        self.coeff = PriceCoefficients.of(self.policy)
        spec_on = self.config.speculation is not SpeculationMode.OFF
        self.resources = ResourcePool(self.config.request_slots, self.config.kv_pages,
                                      self.config.page_tokens, self.config.max_context,
                                      self.config.draft_capacity if spec_on else 0)
        self.queue = ExecutionQueue(self.config.frame_slots)
        self.requests: dict[RequestHandle, Request] = {}
        self.stats = ExecutionStats()
        self.traces: deque[PlanTrace] = deque(maxlen=4096)
        self.now_ns = 0
        self._next_handle = 0
        self._last_fence: Fence | None = None
        self._decisions = 0
        self._retired: deque[RequestHandle] = deque(maxlen=RETIRED_MEMORY)
        self._retired_set: set[RequestHandle] = set()
        self._decode_shapes = catalog.of_kind(GraphKind.DECODE)
        self._prefill_shapes = {k: catalog.of_kind(k) for k in (GraphKind.PREFILL, GraphKind.SCORED_PREFILL)}
        self._spec_shapes = catalog.of_kind(GraphKind.SPECULATIVE) if spec_on else ()
        if any(sh.proposal_depth > self.config.draft_capacity for sh in self._spec_shapes):
            raise InvalidRequest("a speculative program's depth exceeds draft_capacity")
        self.speculation = SpeculationModel(self.config.draft_capacity)
        self.source = ProposalSource.COPY if self.config.copy_proposals else ProposalSource.LEARNED
        self._delivery_shapes = self._decode_shapes + self._spec_shapes

    # ---- time and requests -------------------------------------------------------------
    def advance_to(self, now_ns: int) -> None:
        if not isinstance(now_ns, int) or now_ns < self.now_ns:
            raise HeliosError(f"time must be a nondecreasing integer: {now_ns!r} < {self.now_ns}")
        self.now_ns = now_ns

    def admit(self, request: RequestSpec, now_ns: int) -> RequestHandle:
        self.advance_to(now_ns)
        if request.prompt_tokens + 1 > self.config.max_context:
            raise InvalidRequest(f"prompt of {request.prompt_tokens} tokens leaves no room in a "
                                 f"{self.config.max_context}-token context")
        if request.score_prompt and not self._prefill_shapes[GraphKind.SCORED_PREFILL]:
            raise InvalidRequest("prompt scoring needs scored-prefill graphs, and none is loaded")
        if self.resources.extent_pages(request) > self.resources.total_pages:
            raise InvalidRequest("the request's context extent exceeds the KV page pool")
        handle = self._next_handle
        self._next_handle += 1
        r = Request(handle, request, now_ns, ServiceHistory(self._starting_log_rate()))
        r.prompt_done = request.cached_tokens
        r.update_phase()
        self.requests[handle] = r
        return handle

    def _starting_log_rate(self) -> float:
        # A new request starts at the mean token rate of the live requests, so equal
        # histories mean equal prices and a newcomer is neither favoured nor starved.
        rates = [r.history.log_x for r in self.requests.values() if r.phase is not Phase.DONE]
        if rates:
            return float(np.logaddexp.reduce(rates) - math.log(len(rates)))
        measured = [t for s, t in self.costs.measured().items() if s.kind is GraphKind.DECODE]
        # With no live request: one token per fastest measured decode, else 1 token/ms.
        return -math.log(min(measured) / 1e6) if measured else 0.0

    def cancel(self, handle: RequestHandle, now_ns: int, reason: FinishReason = FinishReason.CANCELLED) -> None:
        """Stop selecting the request now; its slot and pages stay owned through its last fence."""
        self.advance_to(now_ns)
        r = self.requests.get(handle)
        if r is None:
            if handle in self._retired_set:
                return  # cancelling a finished request is a no-op
            raise UnknownRequest(f"unknown request handle {handle}")
        if r.phase is Phase.DONE:
            return
        r.cancelled = True
        r.finish = reason
        r.update_phase()
        r.epoch += 1
        r.version += 1
        self._retire_if_idle(r)

    def _retire_if_idle(self, r: Request) -> None:
        if r.phase is Phase.DONE and not r.inflight:
            self.resources.release(r)
            del self.requests[r.handle]
            if len(self._retired) == self._retired.maxlen:
                self._retired_set.discard(self._retired[0])
            self._retired.append(r.handle)
            self._retired_set.add(r.handle)

    # ---- planning ----------------------------------------------------------------------
    def plan(self) -> ScheduledPlan | None:
        view = self._view()
        if view is None:
            return None
        costs = self._cost_lookup(self.now_ns)
        candidates = decode_candidates(self._decode_shapes, costs, view.decode, view.waiting)
        if self._spec_shapes:
            # Device allocation needs the program's causal confidence; copy proposals have none,
            # so adaptive copy speculation chooses widths with host allocation.
            device = self.config.speculation is SpeculationMode.ADAPTIVE and not self.config.copy_proposals
            candidates += speculative_candidates(self._spec_shapes, costs, view.decode, view.waiting, device)
        budget = Budget(self.resources.free_slots, self.resources.free_pages)
        for kind, (pool, _) in view.prefill.items():
            candidates += prefill_candidates(self._prefill_shapes[kind], costs, pool, view.waiting, budget)
        return self._plan_from(best(candidates), view)

    def _view(self) -> PlanningView | None:
        """Live requests projected to the queue's expected end, or None when nothing can queue."""
        if not self.queue.accepts_more(self.now_ns):
            return None
        live = [r for r in self.requests.values() if r.phase is not Phase.DONE]
        if not live:
            return None
        return build_view(live, self.queue, self.policy, self.coeff, self._decode_costs(), self.resources,
                          self.queue.expected_end_ns(self.now_ns), self.config.max_context,
                          self.config.selection_slots, (self.speculation, self.source) if self._spec_shapes else None)

    def _plan_from(self, winner, view: PlanningView) -> ScheduledPlan | None:
        """Freeze the winning candidate into a plan, or None while it needs an empty window."""
        if winner is None:
            return None
        if winner.shape.kind is GraphKind.SPECULATIVE:
            lanes = tuple(self._spec_lane(view.decode_reqs[i], int(i), int(c), int(rows), winner, view)
                          for i, c, rows in zip(winner.members, winner.ceilings, winner.rows))
        elif winner.shape.kind is GraphKind.DECODE:
            lanes = _decode_lanes(view.decode_reqs, winner, view)
        else:
            reqs = view.prefill[winner.shape.kind][1]
            lanes = tuple(self._prefill_lane(reqs[i], w) for i, w in zip(winner.members.tolist(), winner.works.tolist()))
        requires_feedback = (not winner.shape.kind.queueable or winner.cost_state is not CostState.FRESH
                             or any(l.needs_feedback for l in lanes))
        if len(self.queue) and requires_feedback:
            return None  # the winner needs an empty window: submit nothing until it drains
        est = None if winner.t_ms is None else int(round(winner.t_ms * 1e6))
        reason = SelectionReason.DISCOVERY if est is None else SelectionReason.ORDINARY
        return ScheduledPlan(winner.shape, lanes, est, winner.score, view.log_scale, reason,
                             requires_feedback, winner.cost_state is CostState.STALE, self.now_ns,
                             self.queue.expected_end_ns(self.now_ns), self.queue.fences(), winner.device)

    def _decode_costs(self) -> list[tuple[int, float]]:
        # Every delivery-bearing family: one visible burst per lane, whatever its width.
        return [(s.batch_capacity, t / 1e6) for s in self._delivery_shapes
                if (t := self.costs.estimate_ns(s)) is not None]

    def _cost_lookup(self, now: int):
        def lookup(shape):
            t = self.costs.estimate_ns(shape)
            return (None if t is None else t / 1e6), self.costs.state(shape, now)
        return lookup

    @staticmethod
    def _prefill_lane(r: Request, work: int) -> Lane:
        finishes = work == r.prompt_left
        # A finishing chunk commits its prompt and can publish one first output token.
        return Lane(r.handle, r.epoch, r.version, r.slot, r.prompt_done + r.queued_prompt, work,
                    r.context_tokens, int(finishes), float(work + finishes), 0.0, 0.0)

    def _spec_lane(self, r: Request, i: int, ceiling: int, rows: int, winner, view) -> Lane:
        pool = view.decode
        t = winner.t_ms or 0.0
        gains = pool.extra_value[i] * pool.survival_alpha[i, : rows - 1].sum()
        value = float(pool.base[i] + gains + pool.age_slope * t)
        # A queued lane can advance by at most min(ceiling, P) tokens: limits account for that.
        bound = min(ceiling, winner.shape.target_capacity)
        expected = expected_output(pool.survival[i], rows)
        return Lane(r.handle, r.epoch, r.version, r.slot, r.prompt_done + r.queued_prompt, 0,
                    r.context_tokens, bound, expected, 1.0, value,
                    needs_feedback=r.spec.host_feedback and bool(r.inflight), predicted_rows=rows)

    def seed_acceptance(self, survival, source: ProposalSource | None = None) -> None:
        """Preseed the population acceptance prior (prefix survival by depth)."""
        self.speculation.acceptance_prior[source or self.source].seed(survival)

    # ---- commit ------------------------------------------------------------------------
    def commit(self, plan: ScheduledPlan, fence: Fence) -> None:
        now = self.now_ns
        if not isinstance(fence, int) or (self._last_fence is not None and fence <= self._last_fence):
            raise StalePlan(f"fence {fence!r} must be an integer greater than {self._last_fence}")
        if plan.queue_fences != self.queue.fences():
            raise StalePlan("the execution queue changed since this plan was made")
        if len(self.queue) and (plan.requires_feedback or not self.queue.accepts_more(now)):
            raise QueueFull("the plan needs an empty window, or the queue has no room")
        state = self.costs.state(plan.shape, now)
        if len(self.queue) and state is not CostState.FRESH:
            raise StalePlan(f"the cost of {plan.shape.label()} went stale after planning")
        newcomers = []
        for lane in plan.lanes:
            r = self.requests.get(lane.handle)
            if r is None or r.phase is Phase.DONE:
                raise StalePlan(f"request {lane.handle} is no longer runnable")
            if r.epoch != lane.epoch or r.version != lane.version:
                raise StalePlan(f"request {lane.handle} changed since planning")
            if r.slot is None:
                newcomers.append(r)
        need = sum(self.resources.extent_pages(r.spec) for r in newcomers)
        if len(newcomers) > self.resources.free_slots or need > self.resources.free_pages:
            raise StalePlan("not enough free slots or pages for the plan's new requests")
        # Validated: mutate.
        for r in newcomers:
            self.resources.acquire(r)
        isolated = not len(self.queue)
        start = self.queue.expected_end_ns(now)
        end = None if plan.estimated_duration_ns is None else start + plan.estimated_duration_ns
        self._decisions += 1
        expected = {}
        for lane in plan.lanes:
            r = self.requests[lane.handle]
            r.queued_prompt += lane.prompt_tokens
            r.queued_output += lane.output_rows
            r.inflight.append(fence)
            r.version += 1
            r.last_served_seq = self._decisions
            expected[lane.handle] = (lane.expected_tokens, lane.expected_deliveries)
        participants = tuple((r.handle, r.epoch) for r in self.requests.values() if r.phase is not Phase.DONE)
        sigma_norm = self._normalizer()
        self.queue.push(Frame(fence, plan, plan.reason, now, end, isolated, participants,
                              sigma_norm, sigma_norm, expected))
        self.costs.attempted(plan.shape, now)
        self._last_fence = fence
        self.traces.append(PlanTrace(fence, plan.shape, plan.handles, plan.estimated_duration_ns,
                                     self.costs.observation_age_ns(plan.shape, now), plan.reason,
                                     plan.score, plan.log_scale, now))

    def _normalizer(self) -> float | None:
        # Reference per-stream rate (per ms) of the fastest batch-feasible measured decode.
        k = max(1, sum(1 for r in self.requests.values() if r.phase is Phase.DECODE))
        costs = self._decode_costs()
        if not costs:
            return None
        return 1.0 / (k * min(t / min(b, k) for b, t in costs))

    # ---- completion and publication ----------------------------------------------------
    def complete(self, fence: Fence, records, timing: ExecutionTiming) -> list[GeneratedToken]:
        """Validate every lane first; a bad completion raises and changes nothing."""
        return self._complete(fence, records, timing, None, None)

    def complete_with_survival(self, fence: Fence, records, timing: ExecutionTiming, survival) -> list[GeneratedToken]:
        """As complete(); `survival` maps handles to completion_speculative_survival rows."""
        return self._complete(fence, records, timing, None, survival)

    def complete_packed_round(self, fence: Fence, records, timing: ExecutionTiming, confidence) -> list[GeneratedToken]:
        """Complete a device-allocated round with its FP32 [2, slots, draft_capacity] sidecar
        (or one per rank, rank 0 first; rank 0 drives host decisions)."""
        return self._complete(fence, records, timing, confidence, None)

    def complete_packed_round_with_survival(self, fence: Fence, records, timing: ExecutionTiming,
                                            confidence, survival) -> list[GeneratedToken]:
        return self._complete(fence, records, timing, confidence, survival)

    def sidecar_shape(self) -> tuple[int, int, int]:
        return (2, self.config.request_slots, self.config.draft_capacity)

    def _complete(self, fence, records, timing, confidence, survival) -> list[GeneratedToken]:
        frame = validate_completion(self.queue, self.requests, fence, records, timing, confidence, survival,
                                    self.sidecar_shape())
        self.queue.pop()
        out = apply_completion(self, frame, records, timing, confidence, survival)
        for r in [self.requests[lane.handle] for lane in frame.plan.lanes if lane.handle in self.requests]:
            self._retire_if_idle(r)
        return out

    # ---- the caller surface beyond the spec's API (see protocol.py) ------------------------
    def is_live(self, handle: RequestHandle) -> bool:
        return handle in self.requests

    def snapshot(self) -> SchedulerSnapshot:
        live = [r for r in self.requests.values() if r.phase is not Phase.DONE]
        running = sum(1 for r in live if r.slot is not None)
        s = self.stats
        return SchedulerSnapshot(
            self.now_ns, running, len(live) - running,
            self.resources.free_slots, self.resources.total_slots,
            self.resources.free_pages, self.resources.total_pages, len(self.queue),
            {k.value: v for k, v in s.nanoseconds.items()}, {k.value: v for k, v in s.executions.items()},
            dict(s.by_shape),
            {sh: est for sh in self.catalog if (est := self.costs.estimate_ns(sh)) is not None},
            {"programs": s.speculative_programs, "offered": s.speculative_offered,
             "accepted": s.speculative_accepted, "emitted": s.speculative_emitted,
             "learned_draws": s.speculative_learned_draws})

    def seed_costs(self, samples, now_ns: int) -> None:
        self.advance_to(now_ns)
        for shape, values in samples.items():
            if shape not in self.catalog:
                raise HeliosError(f"cannot seed a cost for {shape.label()}: not in the catalog")
            for ns in values:
                self.costs.observe(shape, ns, now_ns)

    def published_output(self, handle: RequestHandle, fence: Fence) -> None:
        r = self.requests.get(handle)
        if r is None:
            if handle in self._retired_set:
                return
            raise UnknownRequest(f"unknown request handle {handle}")
        r.last_publication_ns = self.now_ns
        pending = r.pending_delivery
        if pending is None or pending[0] != fence:
            return  # a late publication resets age but never rewinds later service
        _, delta_ms, log_z = pending
        if log_z is None:
            r.history.log_z = -math.log(delta_ms)  # first burst: one delivery over its frame
        else:
            r.history.log_z = ewma_log(log_z, delta_ms, 1.0, self.policy.adaptation_ms)
        r.pending_delivery = None


def _decode_lanes(reqs: list[Request], winner, view: PlanningView) -> tuple[Lane, ...]:
    # One lane per served decoder; values are the scaled lane values at the winner's duration.
    values = (view.decode.base[winner.members] + view.decode.age_slope * (winner.t_ms or 0.0)).tolist()
    return tuple(
        Lane(r.handle, r.epoch, r.version, r.slot, r.prompt_done + r.queued_prompt, 0,
             r.prompt_done + r.queued_prompt + r.output_done + r.queued_output, 1, 1.0, 1.0, v,
             r.spec.host_feedback and bool(r.inflight))
        for r, v in zip([reqs[i] for i in winner.members.tolist()], values))

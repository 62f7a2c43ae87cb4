"""The Helios scheduler: admit, cancel, advance_to, plan, commit, complete, published_output."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import replace

import numpy as np

from helios.config import PolicyConfig, PromptRateLaw, SchedulerConfig, SpeculationMode
from helios.errors import InvalidRequest, QueueFull, StalePlan, UnknownRequest, HeliosError
from helios.graphs import Catalog, GraphKind
from helios.scheduler.accounting import Publications
from helios.scheduler.anchors import AnchorCandidate, AnchorCuts
from helios.scheduler.checkpoints import StateOperations
from helios.scheduler.completion import ExecutionStats, apply_completion, validate_completion
from helios.scheduler.cost import CostState, CostTable
from helios.scheduler.exploration import Exploration
from helios.scheduler.lanes import decode_lanes, prefill_lanes, requires_feedback, speculative_lanes
from helios.scheduler.mixed import mixed_candidates, mixed_lanes
from helios.scheduler.plan import (
    NO_SLOT, ExecutionTiming, Fence, FinishReason, GeneratedToken,
    RequestHandle, RequestSpec, ScheduledPlan, SelectionReason,
)
from helios.scheduler.planning import PlanningView, build_view
from helios.scheduler.prerequisites import (
    restore_candidates, restore_log_scale, snapshot_candidates, terminal_waiting,
)
from helios.scheduler.protocol import SchedulerSnapshot
from helios.scheduler.policy import Budget, best, decode_candidates, prefill_candidates
from helios.scheduler.preemption import due as preemption_due
from helios.scheduler.requests import DONE, RequestRow, RequestTable
from helios.scheduler.resources import ResourcePool
from helios.scheduler.rounds import speculative_candidates
from helios.scheduler.service import PHYSICAL, Normalizers, PriceCoefficients, reference_normalizers
from helios.scheduler.shapes import ShapeSets
from helios.scheduler.speculation import ProposalSource, SpeculationModel, expected_output
from helios.scheduler.tracelog import TraceLog
from helios.scheduler.utility import DecodeReference, count_nonzero
from helios.scheduler.vision import VisionWindows
from helios.scheduler.vision_candidates import WindowCandidate, window_candidates, window_log_scale
from helios.scheduler.queue import ExecutionQueue, Frame

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
        self.requests = RequestTable(self.config.draft_capacity)
        self.publications = Publications(self.requests, self.policy.adaptation_ms)
        self.stats = ExecutionStats()
        self.exploration = Exploration(self.config.funded_exploration)  # timing refresh, acceptance learning
        self.traces = TraceLog(4096, self.exploration.refresh.den, self.exploration.learning.den)
        self.now_ns = 0
        self._next_handle = 0
        self._last_fence: Fence | None = None
        self._decisions = 0  # served lanes record it: 0 is "never served"
        # Moved by every call that can change the table (admit, cancel, commit, completion,
        # preempt): a plan made at the current stamp still has the rows, epochs and versions it
        # read (ScheduledPlan.resolved), and commit need not look them up again.
        self._stamp = 0
        # (fence, stamp, handles, rows) of the last completion's bursts: a publication of exactly
        # those handles, before any call changes the table, reuses their rows (published_outputs).
        self._bursts: tuple | None = None
        self._retired: deque[RequestHandle] = deque(maxlen=RETIRED_MEMORY)
        self._retired_set: set[RequestHandle] = set()
        self.shapes = ShapeSets.of(catalog, spec_on, self.mixed_graphs)
        self._derived_cache, self._derived_version = None, None  # see _derived
        # State-row reservation (draft_capacity) covers the widest verification of the separate
        # and the mixed catalogs.
        if self.shapes.max_verification_width - 1 > self.config.draft_capacity or any(
                sh.proposal_depth > self.config.draft_capacity for sh in self.shapes.speculative + self.shapes.mixed):
            raise InvalidRequest("a speculative or mixed program's depth exceeds draft_capacity")
        self.speculation = SpeculationModel(self.config.draft_capacity, self.config.acceptance_estimate)
        self.source = ProposalSource.COPY if self.config.copy_proposals else ProposalSource.LEARNED
        self.state = StateOperations(catalog, self.policy, self.plans_state_operations,  # restores, captures
                                     self.config.checkpoint_extra_work_fraction)
        self.vision = VisionWindows(catalog, self.config, self.plans_state_operations)  # image windows
        self.anchors = AnchorCuts.of(catalog, self.shapes, self.state.enabled,  # extra prefill cuts
                                     self.config.checkpoint_extra_work_fraction)

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
        windows = self.vision.check(request, self._max_chunk(request)) if request.images else ()
        self._stamp += 1  # validated: the table changes
        handle = self._next_handle
        self._next_handle += 1
        # With the mean-rate law, the starting rate counts as one adaptation time of history.
        window = None if self.policy.prompt_rate_law is PromptRateLaw.EWMA else self.policy.adaptation_ms
        self.requests.add(handle, request, self._starting_log_rate(), window)
        self.state.admitted(handle, request)
        self.anchors.admitted(handle, request, self.costs.estimate_ns)
        if windows:
            self.vision.admitted(handle, request, windows)
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
        if self.policy.phase_normalized:
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
        self._stamp += 1
        t.cancelled[row] = True
        t.set_finish(row, reason)
        t.update_phase([row])
        t.rebind(row)
        self.state.forget(handle)
        self.anchors.forget(handle)
        self._retire_idle([row])

    def _retire_idle(self, rows) -> None:
        t = self.requests
        rows = np.asarray(rows, dtype=np.int64)
        for row in rows[(t.phase[rows] == DONE) & (t.inflight[rows] == 0)].tolist():
            handle = int(t.handle[row])
            if self.state.holds(handle):
                continue  # a terminal capture retires through its snapshot
            if self.vision.requests:
                self.vision.retired(handle)  # its private snapshot row, if it still holds one
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

    # ---- planning ----------------------------------------------------------------------
    def plan(self) -> ScheduledPlan | None:
        view = self._view()
        if view is None:
            return None
        costs = self._cost_lookup(self.now_ns)
        if self.state.captures:
            view.waiting += terminal_waiting(self.state, view.log_scale)
        candidates = self._state_candidates(view, costs)
        if self.vision.requests:  # vision graphs and window snapshots/restores (vision_candidates.py)
            candidates += self._window_candidates(view, costs)
        candidates += decode_candidates(self.shapes.decode, costs, view.decode, view.waiting)
        # Device allocation needs the program's causal confidence; copy proposals have none,
        # so adaptive copy speculation chooses widths with host allocation.
        device = self.config.speculation is SpeculationMode.ADAPTIVE and not self.config.copy_proposals
        if self.shapes.speculative:
            candidates += speculative_candidates(self.shapes.speculative, costs, view.decode, view.waiting, device)
        budget = Budget(self.resources.free_slots, self.resources.free_pages) if view.prefill or self.shapes.mixed else None
        for kind, (pool, _) in view.prefill.items():
            candidates += prefill_candidates(self.shapes.prefill_of(kind), costs, pool, view.waiting, budget)
        if self.shapes.mixed:
            prompts = view.prefill.get(GraphKind.PREFILL)
            candidates += mixed_candidates(self.shapes.mixed, costs, view.decode,
                                           None if prompts is None else prompts[0], view.waiting, budget)
        # Funded exploration may displace the ordinary winner.
        chosen, reason = self.exploration.choose(self, candidates, best(candidates), view, costs, device)
        return self._plan_from(chosen, view, reason)

    def _state_candidates(self, view: PlanningView, costs) -> list:
        """Terminal snapshots and prerequisite restores (prerequisites.py)."""
        if not self.state.enabled:
            return []
        budget = Budget(self.resources.free_slots, self.resources.free_pages)
        start = self.queue.expected_end_ns(self.now_ns)
        pages = lambda rows: self.resources.extent_pages_of(self.requests, rows)  # noqa: E731
        return (snapshot_candidates(self.state, self.requests, costs, view.log_scale, view.waiting, start)
                + self.anchors.candidates(self.requests, self.state.captures, costs, self.shapes.decode,
                                          self._coeff(), view.log_scale, view.waiting)
                + restore_candidates(self.state, self.requests, costs, self.shapes.prefill, self.shapes.decode,
                                     self._coeff(), view.log_scale, view.waiting, budget, pages,
                                     view.prefill.get(GraphKind.PREFILL, (None,))[0], view.decode))

    def _window_candidates(self, view: PlanningView, costs) -> list:
        t = self.requests
        shapes_of = lambda row: self.shapes.prefill_of(  # noqa: E731
            GraphKind.SCORED_PREFILL if t.score_prompt[row] else GraphKind.PREFILL)
        return window_candidates(self.vision, t, self.state.restoring, costs, shapes_of, self._coeff(),
                                 view.log_scale, view.waiting,
                                 Budget(self.resources.free_slots, self.resources.free_pages),
                                 lambda rows: self.resources.extent_pages_of(t, rows), view.prefill)

    def _view(self) -> PlanningView | None:
        """Live requests projected to the queue's expected end, or None when nothing can queue."""
        if not self.queue.accepts_more(self.now_ns):
            return None
        self.publications.flush()
        live = self.requests.live_rows()
        if self.state.restoring or self.state.captures:  # restores not completed, preemptions
            live = live[~self.state.not_ready(self.requests, live)]
        if self.vision.requests:  # prompts waiting for a window operation
            live = live[~self.vision.not_ready(self.requests, live)]
        if self.anchors.requests:  # prompts at a cut, or waiting for its anchor snapshot
            live = live[~self.anchors.not_ready(self.requests, live)]
        if not len(live) and not (self.state.captures or self.state.restoring or self.vision.requests
                                  or self.anchors.requests):
            return None
        decode, norm, coeff = self._derived()
        floor = restore_log_scale(self.state, self.requests, coeff)
        if self.vision.requests:
            floor = max(floor, window_log_scale(self.vision, self.requests, coeff))
        if self.anchors.requests:
            floor = max(floor, self.anchors.log_scale(self.requests, coeff))
        view = build_view(self.requests, live, self.queue, self.policy, coeff, decode, norm,
                          self.resources, self.queue.expected_end_ns(self.now_ns), self.config.max_context,
                          self.config.selection_slots,
                          (self.speculation, self.source) if self.shapes.rounds else None, floor)
        if self.vision.requests:
            self.vision.restrict(view, self.requests)  # legal chunk ends of image requests
        if self.anchors.requests:
            self.anchors.restrict(view, self.requests)  # no chunk passes a planned cut
        return view

    def _plan_from(self, winner, view: PlanningView, reason: SelectionReason | None = None) -> ScheduledPlan | None:
        """Freeze the winning candidate into a plan, or None while it needs an empty window."""
        if winner is None:
            return None
        kind, t_ms, rows = winner.shape.kind, winner.t_ms or 0.0, None
        window, anchor = type(winner) is WindowCandidate, type(winner) is AnchorCandidate
        if window or anchor:
            lanes = winner.lanes_of()
        elif kind in (GraphKind.SNAPSHOT, GraphKind.RESTORE):
            lanes = self.state.lanes(self.requests, kind, winner.table_rows[winner.members],
                                     winner.lane_values[winner.members])
        elif kind is GraphKind.SPECULATIVE:
            lanes = self._spec_lanes(winner, view)
        elif kind is GraphKind.MIXED:
            lanes = mixed_lanes(self.requests, winner, view)
        elif kind is GraphKind.DECODE:
            # Values are the scaled lane values at the winner's duration.
            values = view.decode.base[winner.members] + view.decode.age_slope * t_ms
            rows, members = view.decode_rows[winner.members], winner.members
            if view.decode_cursor is None:
                lanes = decode_lanes(self.requests, rows, values)
            else:  # the view's cursors and outputs at these rows: the table's, without reading it again
                lanes = decode_lanes(self.requests, rows, values, view.decode_cursor[members],
                                     view.decode_produced[members])
        else:
            rows = view.prefill[kind][1][winner.members]
            lanes = prefill_lanes(self.requests, rows, winner.works)
        feedback = requires_feedback(winner.shape, winner.cost_state, lanes)
        if len(self.queue) and feedback:
            return None  # the winner needs an empty window: submit nothing until it drains
        est = None if winner.t_ms is None else int(round(winner.t_ms * 1e6))
        if reason is None:
            reason = SelectionReason.DISCOVERY if est is None else SelectionReason.ORDINARY
        return ScheduledPlan(winner.shape, lanes, est, winner.score, view.log_scale, reason,
                             feedback, winner.cost_state is CostState.STALE, self.now_ns,
                             self.queue.expected_end_ns(self.now_ns), self.queue.fences(), winner.device,
                             None if rows is None else (self.requests, self._stamp, lanes, rows),
                             private_state=window and kind is not GraphKind.VISION, anchor=anchor)

    def _spec_lanes(self, winner, view: PlanningView):
        pool, t = view.decode, winner.t_ms or 0.0
        values, expected = [], []
        for i, rows in zip(winner.members.tolist(), winner.rows.tolist()):
            gains = pool.extra_value[i] * pool.survival_alpha[i, : rows - 1].sum()
            values.append(float(pool.base[i] + gains + pool.age_slope * t))
            expected.append(expected_output(pool.survival[i], rows))
        bounds = np.minimum(winner.ceilings, winner.shape.target_capacity)
        return speculative_lanes(self.requests, view.decode_rows[winner.members], bounds,
                                 np.array(expected), np.array(values), winner.rows)

    def _normalizers(self) -> Normalizers:
        """The phases' reference rates from the measured catalog (docs/scheduling-utility.md)."""
        return self._derived()[1]

    def _decode_reference(self) -> DecodeReference:
        return self._derived()[0]

    def _coeff(self) -> PriceCoefficients:
        """The price coefficients, calibrated to the measured time scale when the policy asks."""
        return self._derived()[2]

    def _derived(self) -> tuple:
        """(decode reference, normalizers, price coefficients): functions of the estimates alone,
        recomputed only when the cost table's version moves (a table without one, e.g. a baseline's time-dependent
        moving average, recomputes at every call)."""
        version = getattr(self.costs, "version", None)
        if version is None or version != self._derived_version or self._derived_cache is None:
            est = self.costs.estimate_ns
            # Every delivery-bearing family: one visible burst per lane, whatever its width.
            decode = [(s.batch_capacity, t / 1e6) for s in self.shapes.delivery if (t := est(s)) is not None]
            norm = PHYSICAL
            if self.policy.phase_normalized:
                prefill = [(s.token_capacity, t / 1e6) for s in self.shapes.prefill + self.shapes.scored_prefill
                           if (t := est(s)) is not None]
                norm = reference_normalizers(prefill, decode)
            coeff = self.coeff
            if self.policy.fairness_time_scale:
                coeff = coeff.time_scaled(reference_normalizers((), decode).log_decode)
            self._derived_cache, self._derived_version = (DecodeReference(decode), norm, coeff), version
        return self._derived_cache

    def _cost_lookup(self, now: int):
        if isinstance(self.costs, CostTable):
            return self.costs.lookup_ms_at(now)

        def lookup(shape):
            t, state = self.costs.lookup(shape, now)
            return (None if t is None else t / 1e6), state
        return lookup

    def seed_acceptance(self, survival, source: ProposalSource | None = None) -> None:
        """Preseed the population acceptance prior (prefix survival by depth)."""
        self.speculation.acceptance_prior[source or self.source].seed(survival)

    # ---- commit ------------------------------------------------------------------------
    def commit(self, plan: ScheduledPlan, fence: Fence) -> None:
        now, t, lanes = self.now_ns, self.requests, plan.lanes
        if not isinstance(fence, int) or (self._last_fence is not None and fence <= self._last_fence):
            raise StalePlan(f"fence {fence!r} must be an integer greater than {self._last_fence}")
        if plan.queue_fences != self.queue.fences():
            raise StalePlan("the execution queue changed since this plan was made")
        if len(self.queue) and (plan.requires_feedback or not self.queue.accepts_more(now)):
            raise QueueFull("the plan needs an empty window, or the queue has no room")
        ledger = self.exploration.ledger(plan.reason)
        if ledger is not None and not ledger.funded():
            raise StalePlan(f"the {plan.reason.value} credit was spent since planning")
        # Freshness is rechecked: a saved plan can outlive the estimate's freshness interval, and a
        # stale dispatch needs an empty queue and completion feedback.
        state = self.costs.state(plan.shape, now)
        if state is not CostState.FRESH:
            if len(self.queue):
                raise StalePlan(f"the cost of {plan.shape.label()} went stale after planning")
            if not plan.requires_feedback:
                plan = replace(plan, requires_feedback=True, stale_cost=True)
        snapshot = plan.shape.kind is GraphKind.SNAPSHOT
        res = plan.resolved
        if res is not None and res[0] is t and res[1] == self._stamp and res[2] is lanes:
            # Nothing changed the table since planning: the planned rows (distinct, live decode or
            # prompt rows) still hold these requests at these epochs and versions, and their slots
            # are the lanes' slot column. The trace turns the read-only handle column into a list.
            rows, handles, unique = res[3], lanes.handle, True
            new = lanes.slot == NO_SLOT
        else:
            handles = lanes.handle.tolist()
            found = list(map(t.index.get, handles))
            try:
                rows = np.fromiter(found, np.int64, len(found))
            except TypeError:  # a None: the request retired (cheaper than searching for None first)
                raise StalePlan(f"request {lanes.handle[found.index(None)]} is no longer runnable") from None
            done = t.phase[rows] == DONE
            if snapshot:  # terminal captures retire through this graph
                done &= ~np.array([self.state.holds(h) for h in handles], dtype=bool)
            bad = done | (t.epoch[rows] != lanes.epoch) | (t.version[rows] != lanes.version)
            if count_nonzero(bad):
                i = int(np.argmax(bad))
                what = "is no longer runnable" if t.phase[rows[i]] == DONE else "changed since planning"
                raise StalePlan(f"request {lanes.handle[i]} {what}")
            unique = len(set(found)) == len(found)
            new = t.slot[rows] == NO_SLOT
        newcomers = rows[new] if count_nonzero(new) else None
        if newcomers is not None:
            need = sum(self.resources.extent_pages_of(t, newcomers).tolist())
            if len(newcomers) > self.resources.free_slots or need > self.resources.free_pages:
                raise StalePlan("not enough free slots or pages for the plan's new requests")
        window = bool(self.vision.requests) and self.vision.is_window_plan(plan)
        if window:
            self.vision.check_commit(plan)  # private snapshot rows
        # Validated: mutate.
        self._stamp += 1
        if window:
            self.vision.committed(plan)
        if newcomers is not None:
            self.resources.acquire(t, newcomers)
            t.resident_ns[newcomers] = now  # the preemption quantum starts here
        isolated = not len(self.queue)
        start = self.queue.expected_end_ns(now)
        end = None if plan.estimated_duration_ns is None else start + plan.estimated_duration_ns
        self._decisions += 1
        if count_nonzero(lanes.prompt_tokens):  # decode lanes queue no prompt
            t.queued_prompt[rows] += lanes.prompt_tokens
        t.queued_output[rows] += lanes.output_rows
        t.inflight[rows] += 1
        t.version[rows] += 1
        t.last_served_seq[rows] = self._decisions
        # Participants: resident runnable and waiting (every live request).
        if not snapshot and unique and t.live_count() == len(rows):
            # The lanes are every live request (the steady state; none is done, so they are
            # live): the lane rows, handles and epochs are the participants', and completion's
            # accounting needs no table-sized scatter (account_interval).
            participants, p_handles, p_epochs = rows, lanes.handle, lanes.epoch
        else:
            participants = t.live_rows()  # the table's cached live rows, not another scan
            p_handles, p_epochs = t.handle[participants], t.epoch[participants]
        self.queue.push(Frame(fence, plan, plan.reason, now, end, isolated, rows, participants,
                              p_handles, p_epochs, self._normalizers(), None if snapshot else t.turnover))
        self._last_fence = fence
        refresh, learning = self.exploration.credit_units()  # before this plan's episode opens
        self.exploration.committed(plan.shape, plan.reason, fence, now)
        # The trace's PlanTrace is built only when read (tracelog.py); `handles` is this call's own list.
        self.traces.record((fence, plan.shape, handles, plan.estimated_duration_ns,
                            self.costs.observation_age_ns(plan.shape, now), plan.reason,
                            plan.score, plan.log_scale, now, refresh, learning))

    # ---- completion --------------------------------------------------------------------
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
        checked = validate_completion(self.queue, self.requests, fence, records, timing, confidence, survival,
                                      None if confidence is None else self.sidecar_shape())
        self._stamp += 1  # validated: the table changes
        self.publications.flush()  # validation reads no rate: a rejected completion changes nothing
        self.queue.pop()
        out, some_done, bursts = apply_completion(self, checked, timing, confidence, survival)
        # No row retires below unless some lane is done; state operations may edit `out`.
        self._bursts = (None if bursts is None or some_done or self.state.enabled
                        else (fence, self._stamp, *bursts))
        if self.state.enabled:  # a catalog without snapshot/restore graphs pays nothing here
            out = self._complete_state(checked.frame.plan, fence, timing, out)
        if self.vision.requests and self.vision.is_window_plan(checked.frame.plan):
            self.vision.completed(checked.frame.plan, self.requests)
        rows = checked.frame.rows
        if some_done or self.state.enabled or self.vision.requests:  # else every lane is still live: none can retire
            self._retire_idle(rows)
        # A lane still live is something left to run (state operations end no request).
        if not len(self.queue) and (some_done or not len(rows)) and not self.requests.live_count():
            self.exploration.idle()  # nothing left to run: idle discards positive credit
        return out

    def _complete_state(self, plan: ScheduledPlan, fence: Fence, timing: ExecutionTiming, out):
        """Capture allowance, state-operation results and terminal captures (checkpoints.py)."""
        sample = timing.cost_sample_ns()
        productive = [g.handle for g in out if g.tokens]
        self.state.earn(plan.shape.kind, productive, None if sample is None else sample / 1e6)
        snap = [t for sh in self.state.snapshot_shapes if (t := self.costs.estimate_ns(sh)) is not None]
        if self.anchors.requests:
            lookup = self._cost_lookup(self.now_ns)
            self.anchors.completed(self.requests, plan, lambda sh: lookup(sh)[1])
        return self.state.completed(self.requests, plan.shape.kind, plan.handles, fence, self.now_ns, out,
                                    lambda row: self.resources.release(self.requests, row),
                                    min(snap) / 1e6 if snap else None)

    # ---- the caller surface beyond the spec's API (see protocol.py) ------------------------
    def preempt(self, handle: RequestHandle, now_ns: int) -> None:
        """Retire a resident decoding request through a snapshot without completing its
        response; it resumes by restore, with the same tokens as an uninterrupted run."""
        self.advance_to(now_ns)
        self.publications.flush()
        self.state.preempt(self.requests, handle, now_ns)
        self._stamp += 1

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
        pairs = preemption_due(self.requests, self.resources, self.state, self.config.preemption, now_ns,
                               self.config.max_context, self._preemption_excluded())  # releases started waiters' holds
        for victim, waiter in pairs:
            self.preempt(victim, now_ns)
            self.state.held[victim] = waiter  # its restore waits until the waiter has started
        return [victim for victim, _ in pairs]

    def _preemption_excluded(self) -> set[RequestHandle]:
        # Image requests with window operations, and requests whose anchor snapshot is due (their
        # state copy is in progress), are neither preempted nor served by the policy.
        return set(self.vision.requests) | {h for h, a in self.anchors.requests.items() if a.due is not None}

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
        if type(fence) is not int:
            raise InvalidRequest(f"a publication names an integer fence, got {fence!r}")
        bursts = self._bursts
        if (bursts is not None and bursts[0] == fence and bursts[1] == self._stamp and type(handles) is list
                and handles and handles == bursts[2]):
            # Every burst of the last completion, in order, with the table as it left it: the
            # frame's rows are these handles' rows (an ndarray, which the flush takes as it is).
            self.publications.reported.append((bursts[3], fence, self.now_ns))
            return
        rows = list(map(self.requests.index.get, handles))
        if None in rows:
            known = [r is not None or h in self._retired_set for h, r in zip(handles, rows)]
            if not all(known):
                raise UnknownRequest(f"unknown request handle {handles[known.index(False)]}")
            rows = [r for r in rows if r is not None]
        if rows:
            self.publications.reported.append((rows, fence, self.now_ns))

"""The plan call (Scheduler.plan): the live requests projected to the queue's expected end (the
planning view), every family's candidates on it, and the winner frozen into a ScheduledPlan.

Functions of `SelectionInputs` (the scheduler's parts that selection reads), the time and the
table's stamp, bottom-up; `Scheduler.plan` is a thin call into `plan`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from helios.config import PolicyConfig, SchedulerConfig, SpeculationMode, StudyConfig
from helios.graphs import GraphKind
from helios.scheduler.accounting import Publications
from helios.scheduler.cost import CostState, cost_lookup
from helios.scheduler.estimates import Estimates
from helios.scheduler.exploration import Exploration
from helios.scheduler.lanes import decode_lanes, prefill_lanes, requires_feedback, speculative_lanes
from helios.scheduler.memo import Memo
from helios.scheduler.mixed import mixed_candidates, mixed_lanes, spec_row_values
from helios.scheduler.plan import ScheduledPlan, SelectionReason
from helios.scheduler.planning import PlanningView, build_view
from helios.scheduler.policy import Budget, best, decode_candidates
from helios.scheduler.prefill import prefill_candidates
from helios.scheduler.prerequisite import PlanInputs
from helios.scheduler.prerequisite_kinds import Prerequisites
from helios.scheduler.prerequisites import StateCandidate
from helios.scheduler.queue import ExecutionQueue
from helios.scheduler.requests import RequestTable
from helios.scheduler.resources import ResourcePool
from helios.scheduler.rounds import speculative_candidates
from helios.scheduler.shapes import ShapeSets
from helios.scheduler.slot_share import current_shares
from helios.scheduler.speculation import ProposalSource, SpeculationModel


@dataclass(frozen=True, slots=True)
class SelectionInputs:
    """What selection reads of the scheduler: its parts, by reference (the Scheduler builds one).
    The time and the table's stamp arrive as parameters."""

    requests: RequestTable
    resources: ResourcePool
    queue: ExecutionQueue
    publications: Publications  # flushed before the view reads the rates
    prereqs: Prerequisites
    costs: object  # CostTable, or a baseline's
    estimates: Estimates
    shapes: ShapeSets
    policy: PolicyConfig
    study: StudyConfig
    config: SchedulerConfig
    speculation: SpeculationModel
    source: ProposalSource
    memo: Memo
    exploration: Exploration


def derived(inputs) -> tuple:
    """(decode reference, normalizers, price coefficients) of `inputs` (a SelectionInputs or a
    Scheduler): estimates.py."""
    return inputs.estimates.get()


def current_view(sched: SelectionInputs, now_ns: int) -> PlanningView | None:
    """Live requests projected to the queue's expected end, or None when nothing can queue."""
    if not sched.queue.accepts_more(now_ns):
        return None
    sched.publications.flush()
    prereqs = sched.prereqs
    # Requests waiting for prerequisite work (a restore, a window operation, an anchor snapshot).
    live = sched.requests.live_rows()
    held_out = frozenset()
    if sched.config.slot_share:  # waiters of clients past their share of the slots (slot_share.py)
        live, held_out = hold_back_clients(sched.requests, live, sched.resources.free_slots, prereqs, sched.memo)
    if prereqs.active:  # a catalog without state or vision graphs (or a baseline) has none
        live = prereqs.hold_back(sched.requests, live)
    if not len(live) and not prereqs.pending():
        return None
    decode, norm, coeff = sched.estimates.get()
    floor = prereqs.log_scale(sched.requests, coeff) if prereqs.active else -math.inf  # lanes outside the pools
    view = build_view(sched.requests, live, sched.queue, sched.policy, sched.study, coeff, decode, norm,
                      sched.resources, sched.queue.expected_end_ns(now_ns), sched.config.max_context,
                      sched.config.selection_slots,
                      (sched.speculation, sched.source) if sched.shapes.rounds else None, floor,
                      defer_prompts=bool(sched.shapes.mixed), memo=sched.memo.decay)
    if prereqs.active:
        prereqs.restrict(view, sched.requests)  # legal chunk ends (images, planned cuts)
    view.held_out = held_out
    return view


def hold_back_clients(t: RequestTable, live: np.ndarray, free_slots: int, prereqs: Prerequisites, memo: Memo):
    """(`live` without the waiters past their client's part of the free slots, the handles held
    back): slot admission by client share (slot_share.py)."""
    shares = current_shares(t, prereqs.kinds["state"].ops.captures, memo)
    if shares is None:
        return live, frozenset()
    blocked = shares.blocked_rows(t, free_slots)
    if not blocked.any():
        return live, frozenset()
    return live[~blocked], frozenset(t.handle[live[blocked]].tolist())


def _spec_lanes(sched: SelectionInputs, winner, view: PlanningView):
    values, expected = spec_row_values(view.decode, winner.members, winner.rows, winner.t_ms or 0.0)
    bounds = np.minimum(winner.ceilings, winner.shape.target_capacity)
    return speculative_lanes(sched.requests, view.decode_rows[winner.members], bounds, expected, values, winner.rows)


def plan_from(sched: SelectionInputs, winner, view: PlanningView, now_ns: int, stamp: int,
              reason: SelectionReason | None = None) -> ScheduledPlan | None:
    """Freeze the winning candidate into a plan, or None while it needs an empty window. `stamp`:
    the table's stamp the plan was made at (ScheduledPlan.resolved)."""
    if winner is None:
        return None
    kind, t_ms, rows = winner.shape.kind, winner.t_ms or 0.0, None
    prereq = isinstance(winner, StateCandidate)  # every prerequisite kind's candidate
    if prereq:
        lanes = winner.lanes_of()
    elif kind is GraphKind.SPECULATIVE:
        lanes = _spec_lanes(sched, winner, view)
    elif kind is GraphKind.MIXED:
        lanes = mixed_lanes(sched.requests, winner, view)
    elif kind is GraphKind.DECODE:
        # Values are the scaled lane values at the winner's duration.
        values = view.decode.base[winner.members] + view.decode.age_slope * t_ms
        rows, members = view.decode_rows[winner.members], winner.members
        if view.decode_cursor is None:
            lanes = decode_lanes(sched.requests, rows, values)
        else:  # the view's cursors and outputs at these rows: the table's, without reading it again
            lanes = decode_lanes(sched.requests, rows, values, view.decode_cursor[members],
                                 view.decode_produced[members])
    else:
        rows = view.prefill[kind][1][winner.members]
        lanes = prefill_lanes(sched.requests, rows, winner.works)
    feedback = requires_feedback(winner.shape, winner.cost_state, lanes)
    if len(sched.queue) and feedback:
        return None  # the winner needs an empty window: submit nothing until it drains
    est = None if winner.t_ms is None else int(round(winner.t_ms * 1e6))
    if reason is None:
        reason = SelectionReason.DISCOVERY if est is None else SelectionReason.ORDINARY
    return ScheduledPlan(winner.shape, lanes, est, winner.score, view.log_scale, reason,
                         feedback, winner.cost_state is CostState.STALE, now_ns,
                         sched.queue.expected_end_ns(now_ns), sched.queue.fences(), winner.device,
                         None if rows is None else (sched.requests, stamp, lanes, rows),
                         private_state=prereq and winner.private_state, anchor=prereq and winner.anchor)


def plan(sched: SelectionInputs, now_ns: int, stamp: int) -> tuple[ScheduledPlan | None, tuple | None]:
    """Scheduler.plan: the best plan for the current view at `now_ns` (or None), and the selection
    behind it (view, candidates, chosen; None when there was nothing to choose from)."""
    view = current_view(sched, now_ns)
    if view is None:
        return None, None
    costs = cost_lookup(sched.costs, now_ns)
    prereqs = sched.prereqs
    candidates = []
    if prereqs.proposes:  # restores, captures, anchor snapshots, window operations
        extra = prereqs.waiting(view.log_scale)
        if extra:
            view.waiting += extra  # terminal captures' age price
        candidates = prereqs.candidates(PlanInputs(sched.requests, sched.resources, sched.shapes, derived(sched)[2],
                                                   sched.queue.expected_end_ns(now_ns)), view, costs)
    candidates += decode_candidates(sched.memo, sched.shapes.decode, costs, view.decode, view.waiting)
    # Device allocation needs the program's causal confidence; copy proposals have none,
    # so adaptive copy speculation chooses widths with host allocation.
    device = sched.config.speculation is SpeculationMode.ADAPTIVE and not sched.config.copy_proposals
    if sched.shapes.speculative:
        # Programs whose score cannot reach another candidate's are not built; stale ones are kept
        # while a funded timing refresh could choose them.
        candidates += speculative_candidates(sched.shapes.speculative, costs, view.decode, view.waiting, device,
                                             prune=True, keep_stale=sched.exploration.refresh.funded(), memo=sched.memo)
    budget = Budget(sched.resources.free_slots, sched.resources.free_pages) if view.prefill or sched.shapes.mixed else None
    for kind, (pool, _) in view.prefill.items():
        candidates += prefill_candidates(sched.memo, sched.shapes.prefill_of(kind), costs, pool, view.waiting, budget)
    if sched.shapes.mixed:
        prompts = view.prefill.get(GraphKind.PREFILL)
        candidates += mixed_candidates(sched.memo, sched.shapes.mixed, costs, view.decode,
                                       None if prompts is None else prompts[0], view.waiting, budget)
    # Funded exploration may displace the ordinary winner.
    chosen, reason = sched.exploration.choose(sched, candidates, best(candidates), view, costs, device)
    # The view, the evaluated candidates and the winner go back as references for the decision log
    # (Scheduler.selection_detail); nothing is copied.
    return plan_from(sched, chosen, view, now_ns, stamp, reason), (view, candidates, chosen)

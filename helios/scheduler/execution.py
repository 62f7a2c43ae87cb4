"""A plan's execution, from commit to publication (Scheduler.commit, complete*, published_outputs):
commit validates a plan against the table and queues its frame; completion validates the
frame's records, applies them (completion.py) and runs the prerequisite kinds' completion steps
(prerequisite_kinds.py) and retirement; publication reports delivered bursts to the service accounting.

Functions of `ExecutionInputs` (the scheduler's parts that commit, completion and publication
read or move) and the time; the Scheduler methods are thin calls into them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import numpy as np

from helios.errors import InvalidRequest, QueueFull, StalePlan, UnknownRequest
from helios.graphs import GraphKind
from helios.scheduler.completion import apply_completion
from helios.scheduler.completion_check import validate_completion
from helios.scheduler.cost import CostState
from helios.scheduler.plan import NO_SLOT, ExecutionTiming, Fence, GeneratedToken, ScheduledPlan
from helios.scheduler.queue import Frame
from helios.scheduler.requests import DONE
from helios.scheduler.prerequisite import Completed
from helios.scheduler.utility import count_nonzero


@dataclass(slots=True)
class Marks:
    """What commit, completion and the scheduler's other calls move."""

    # Moved by every call that can change the table (admit, cancel, commit, completion, preempt):
    # a plan made at the current stamp still has the rows, epochs and versions it read
    # (ScheduledPlan.resolved), and commit need not look them up again.
    stamp: int = 0
    decisions: int = 0  # served lanes record it: 0 is "never served"
    last_fence: Fence | None = None
    # (fence, stamp, handles, rows) of the last completion's bursts: a publication of exactly those
    # handles, before any call changes the table, reuses their rows (publish).
    bursts: tuple | None = None


@dataclass(frozen=True, slots=True)
class ExecutionInputs:
    """What commit, completion and publication read or move of the scheduler: its parts, by
    reference (the Scheduler builds one), its marks, and how a row retires."""

    requests: object  # RequestTable
    resources: object  # ResourcePool
    queue: object  # ExecutionQueue
    publications: object  # Publications
    prereqs: object  # Prerequisites
    costs: object  # CostTable, or a baseline's
    estimates: object  # Estimates
    exploration: object  # Exploration
    traces: object  # TraceLog
    stats: object  # ExecutionStats
    config: object  # SchedulerConfig
    policy: object  # PolicyConfig
    study: object  # StudyConfig
    memo: object  # Memo
    speculation: object  # SpeculationModel
    source: object  # ProposalSource
    marks: Marks
    retire: Callable  # rows -> None: retire the rows that are done and idle (Scheduler._retire_idle)
    retired: set  # handles retired recently (a publication may still name them)


def commit(ex: ExecutionInputs, plan: ScheduledPlan, fence: Fence, now: int) -> None:
    """Scheduler.commit: validate everything, then queue the frame and record its trace. Spec,
    "Planning and the execution queue": commit checks ownership, epochs, resource availability and
    feedback dependencies without rerunning selection."""
    plan = _check_window(ex, plan, fence, now)
    rows, handles, unique, new = _check_lanes(ex, plan)
    newcomers = _check_resources(ex, rows, new)
    # The prerequisite kinds whose plan this is, each checked (private window rows).
    owners = ex.prereqs.check_commit(plan) if ex.prereqs.active else ()
    # Validated: mutate.
    ex.marks.stamp += 1
    for kind in owners:
        kind.committed(plan)
    if newcomers is not None:
        ex.resources.acquire(ex.requests, newcomers)
        ex.requests.resident_ns[newcomers] = now  # the preemption quantum starts here
    _queue_frame(ex, plan, fence, rows, unique, now)
    ex.marks.last_fence = fence
    refresh, learning = ex.exploration.credit_units()  # before this plan's episode opens
    ex.exploration.committed(plan.shape, plan.reason, fence, now)
    # The trace's PlanTrace is built only when read (tracelog.py); `handles` is this call's own list.
    ex.traces.record((fence, plan.shape, handles, plan.estimated_duration_ns,
                         ex.costs.observation_age_ns(plan.shape, now), plan.reason,
                         plan.score, plan.log_scale, now, refresh, learning))


def _check_window(ex: ExecutionInputs, plan: ScheduledPlan, fence: Fence, now: int) -> ScheduledPlan:
    """The fence, the queue the plan was made against, room in the window, exploration credit and
    the estimate's freshness (rechecked: a saved plan can outlive the freshness interval, and a
    stale dispatch needs an empty queue and completion feedback). Returns the plan to queue."""
    if not isinstance(fence, int) or (ex.marks.last_fence is not None and fence <= ex.marks.last_fence):
        raise StalePlan(f"fence {fence!r} must be an integer greater than {ex.marks.last_fence}")
    if plan.queue_fences != ex.queue.fences():
        raise StalePlan("the execution queue changed since this plan was made")
    if len(ex.queue) and (plan.requires_feedback or not ex.queue.accepts_more(now)):
        raise QueueFull("the plan needs an empty window, or the queue has no room")
    ledger = ex.exploration.ledger(plan.reason)
    if ledger is not None and not ledger.funded():
        raise StalePlan(f"the {plan.reason.value} credit was spent since planning")
    state = ex.costs.state(plan.shape, now)
    if state is not CostState.FRESH:
        if len(ex.queue):
            raise StalePlan(f"the cost of {plan.shape.label()} went stale after planning")
        if not plan.requires_feedback:
            plan = replace(plan, requires_feedback=True, stale_cost=True)
    return plan


def _check_lanes(ex: ExecutionInputs, plan: ScheduledPlan):
    """Ownership and epochs: every lane's request is still runnable at the epoch and version it
    was planned at. Returns (rows, handles, unique, new): the lanes' table rows, their handles
    (for the trace), whether the rows are distinct, and which lanes have no slot yet."""
    t, lanes = ex.requests, plan.lanes
    res = plan.resolved
    if res is not None and res[0] is t and res[1] == ex.marks.stamp and res[2] is lanes:
        # Nothing changed the table since planning: the planned rows (distinct, live decode or
        # prompt rows) still hold these requests at these epochs and versions, and their slots
        # are the lanes' slot column. The trace turns the read-only handle column into a list.
        return res[3], lanes.handle, True, lanes.slot == NO_SLOT
    handles = lanes.handle.tolist()
    found = list(map(t.index.get, handles))
    try:
        rows = np.fromiter(found, np.int64, len(found))
    except TypeError:  # a None: the request retired (cheaper than searching for None first)
        raise StalePlan(f"request {lanes.handle[found.index(None)]} is no longer runnable") from None
    done = t.phase[rows] == DONE
    if plan.shape.kind is GraphKind.SNAPSHOT:  # terminal captures retire through this graph
        done &= ~np.array([ex.prereqs.holds(h) for h in handles], dtype=bool)
    bad = done | (t.epoch[rows] != lanes.epoch) | (t.version[rows] != lanes.version)
    if count_nonzero(bad):
        i = int(np.argmax(bad))
        what = "is no longer runnable" if t.phase[rows[i]] == DONE else "changed since planning"
        raise StalePlan(f"request {lanes.handle[i]} {what}")
    return rows, handles, len(set(found)) == len(found), t.slot[rows] == NO_SLOT


def _check_resources(ex: ExecutionInputs, rows, new):
    """Resource availability: slots and page extents for the lanes' requests without a slot.
    Returns their rows (None: every lane is resident)."""
    if not count_nonzero(new):
        return None
    newcomers = rows[new]
    need = sum(ex.resources.extent_pages_of(ex.requests, newcomers).tolist())
    if len(newcomers) > ex.resources.free_slots or need > ex.resources.free_pages:
        raise StalePlan("not enough free slots or pages for the plan's new requests")
    return newcomers


def _queue_frame(ex: ExecutionInputs, plan: ScheduledPlan, fence: Fence, rows, unique: bool, now: int) -> None:
    """The frame's queued service on its rows, its participants (every live request: resident
    runnable and waiting), the commit-time normalizers, and the frame in the queue."""
    t, lanes = ex.requests, plan.lanes
    snapshot = plan.shape.kind is GraphKind.SNAPSHOT
    isolated = not len(ex.queue)
    start = ex.queue.expected_end_ns(now)
    end = None if plan.estimated_duration_ns is None else start + plan.estimated_duration_ns
    ex.marks.decisions += 1
    if count_nonzero(lanes.prompt_tokens):  # decode lanes queue no prompt
        t.queued_prompt[rows] += lanes.prompt_tokens
    t.queued_output[rows] += lanes.output_rows
    t.inflight[rows] += 1
    t.version[rows] += 1
    t.last_served_seq[rows] = ex.marks.decisions
    if not snapshot and unique and t.live_count() == len(rows):
        # The lanes are every live request (the steady state; none is done, so they are
        # live): the lane rows, handles and epochs are the participants', and completion's
        # accounting needs no table-sized scatter (account_interval).
        participants, p_handles, p_epochs = rows, lanes.handle, lanes.epoch
    else:
        participants = t.live_rows()  # the table's cached live rows, not another scan
        p_handles, p_epochs = t.handle[participants], t.epoch[participants]
    ex.queue.push(Frame(fence, plan, plan.reason, now, end, isolated, rows, participants,
                           p_handles, p_epochs, ex.estimates.get()[1], None if snapshot else t.turnover))


def complete(ex: ExecutionInputs, fence, records, timing, confidence, survival, now: int) -> list[GeneratedToken]:
    """Every Scheduler.complete* call: validate every lane first; a bad completion raises and changes nothing."""
    checked = validate_completion(ex.queue, ex.requests, fence, records, timing, confidence, survival,
                                  None if confidence is None else (2, ex.config.request_slots, ex.config.draft_capacity))
    ex.marks.stamp += 1  # validated: the table changes
    ex.publications.flush()  # validation reads no rate: a rejected completion changes nothing
    ex.queue.pop()
    out, some_done, bursts = apply_completion(ex, checked, timing, confidence, survival, now)
    prereqs = ex.prereqs
    # No row retires below unless some lane is done or a prerequisite kind retires one; a kind's
    # completion (a terminal capture) may edit `out`.
    ex.marks.bursts = (None if bursts is None or some_done or prereqs.edits_output
                     else (fence, ex.marks.stamp, *bursts))
    if prereqs.completes:  # a catalog without snapshot, restore or vision graphs pays nothing here
        t = ex.requests
        out = prereqs.completed(Completed(t, checked.frame.plan, fence, timing, ex.costs, now,
                                          lambda row: ex.resources.release(t, row)), out)
    rows = checked.frame.rows
    if some_done or (prereqs.active and prereqs.may_retire()):  # else every lane is still live: none can retire
        ex.retire(rows)
    # A lane still live is something left to run (state operations end no request).
    if not len(ex.queue) and (some_done or not len(rows)) and not ex.requests.live_count():
        ex.exploration.idle()  # nothing left to run: idle discards positive credit
    return out


def publish(ex: ExecutionInputs, handles, fence: Fence, now: int) -> None:
    """Scheduler.published_outputs: checked before anything is recorded."""
    if type(fence) is not int:
        raise InvalidRequest(f"a publication names an integer fence, got {fence!r}")
    bursts = ex.marks.bursts
    if (bursts is not None and bursts[0] == fence and bursts[1] == ex.marks.stamp and type(handles) is list
            and handles and handles == bursts[2]):
        # Every burst of the last completion, in order, with the table as it left it: the
        # frame's rows are these handles' rows (an ndarray, which the flush takes as it is).
        ex.publications.reported.append((bursts[3], fence, now))
        return
    rows = list(map(ex.requests.index.get, handles))
    if None in rows:
        known = [r is not None or h in ex.retired for h, r in zip(handles, rows)]
        if not all(known):
            raise UnknownRequest(f"unknown request handle {handles[known.index(False)]}")
        rows = [r for r in rows if r is not None]
    if rows:
        ex.publications.reported.append((rows, fence, now))

"""Automatic preemption: which resident decoders to retire so that waiting requests get a turn.

A request takes its slot and whole page extent at its first commit and keeps them until it
finishes, so without preemption a short request that arrives while long generations hold every
slot waits for one of them to end. The mechanism (checkpoints.py, `StateOperations.preempt`)
retires a resident decoder through a SNAPSHOT and resumes it later by a RESTORE with the same
tokens. This module is the policy that decides, at a given time, which decoders to retire.

The PRICE rule (PreemptionConfig), in the scheduler's own terms. A waiter is a ready request
that needs a slot: admitted, live, holding none, with prompt left (a prompt that first restores
a checkpointed prefix counts; a preempted decoder waiting for its restore does not), and no
image window operation pending. While it waits it receives no service, so its token rate x
falls (by e^(-W/tau) on the EWMA law) and its fairness price f/x grows. A resident decoder V may be retired for the
highest-priced waiter W that cannot start when

  - W cannot start: no free slot, or fewer free pages than its extent (slots and pages already
    coming back from preemptions in flight count as free);
  - W's price is at least `price_ratio` times V's:  log x_V - log x_W >= log(price_ratio);
  - V has more output left to produce than W asks for in all (its max_tokens): otherwise W
    would not get its turn sooner than by waiting for V to end (shortest remaining output first;
    requests of equal length never preempt one another);
  - V has held its slot for at least `quantum_ms` since it got it (first commit or restore), so
    every residency makes progress and nothing thrashes;
  - V is decoding with context room left, and no state operation is pending for it;
  - fewer than `max_retiring` preemptions are waiting for their snapshot.

Victims are taken in the key order (most remaining output, longest resident, handle): the one
that would hold its slot longest goes first. A waiter is served only if the victims it may take
cover its whole need (a slot and its page extent); otherwise nothing is retired for it, since a
retirement that does not let it start only costs a snapshot and a restore. Waiters are visited
by price (highest first, then handle); resources freed for one are not counted again for the next.

A preempted request then waits for its restore. The slot was freed for W, so while W (or any
other waiter a victim yielded to) neither holds a slot nor has ended, no preempted decoder
restores (`StateOperations.held`): otherwise a cheap restore could win the slot straight back,
and every quantum would pay a snapshot and a restore for nothing. From then on the restore competes by value per time like every other
candidate (prerequisites.py); the victim's price grew while it waited, so it gets back in. It
does not itself trigger preemption: slots come free as residents finish (each within its
max_tokens), and the restores then compete for them.

With client slot shares on (`SchedulerConfig.slot_share`), the share rule of slot_share.py runs
first (a waiter takes a slot from a client that keeps at least as many per weight); when it
retires anything, the PRICE rule waits for the next call.

Pure and deterministic: no clock (time is `now_ns`), ties broken by handle.
"""

from __future__ import annotations

import math

import numpy as np

from helios.config import PreemptionConfig
from helios.scheduler.checkpoints import StateOperations
from helios.scheduler.requests import DECODE, DONE, NO_SLOT, PREFILL, RequestTable
from helios.scheduler.resources import ResourcePool
from helios.scheduler.slot_share import SlotShares, share_due


def due(t: RequestTable, resources: ResourcePool, state: StateOperations, config: PreemptionConfig,
        now_ns: int, max_context: int, excluded=frozenset(), shares: SlotShares | None = None) -> list[tuple[int, int]]:
    """(victim, waiter) handles: the resident decoders to preempt now, in order, each with the
    waiter it yields to. First releases the holds of waiters that have started or ended.
    `excluded`: handles neither preempted nor served (image requests with window operations).
    `shares`: the clients' slot shares (slot_share.py); when their rule retires anything, the
    price rule waits for the next call."""
    if not config.enabled or not state.enabled:
        return []
    if state.held:
        release(t, state)
    live = t.live_rows()
    waiting = live[(t.slot[live] == NO_SLOT) & (t.phase[live] == PREFILL)]
    if not len(waiting):
        return []  # the common case: everyone live holds a slot
    retiring = [t.index[h] for h, c in state.captures.items() if c.preempted]
    budget = config.max_retiring - len(retiring)
    if budget <= 0:
        return []
    # A prompt restoring a checkpointed prefix before its first prefill (admitted with cached
    # tokens) needs a slot like any newcomer and is a waiter; a preempted request is not (it is
    # DECODE-phase, so `waiting` never holds it).
    skip = set(state.captures) | set(excluded)
    waiters = [r for r in waiting.tolist() if int(t.handle[r]) not in skip]
    if not waiters:
        return []
    # Slots and pages of preemptions in flight come back when their snapshot completes.
    free_slots = resources.free_slots + len(retiring)
    free_pages = resources.free_pages + sum(int(t.pages[r]) for r in retiring)
    need = resources.extent_pages_of(t, np.array(waiters, dtype=np.int64)).tolist()
    if shares is not None:
        order = sorted(zip(waiters, need), key=lambda wp: (float(t.log_x[wp[0]]), int(t.handle[wp[0]])))
        # The share rule has no quantum: it acts once per waiter of an entitled client, never twice
        # for the same slot (slot_share.py), so it cannot thrash.
        eligible = [v for v, _ in _victims(t, config, now_ns, max_context, skip | set(state.restoring), 0)]
        pairs = share_due(t, shares, [w for w, _ in order], dict(order), eligible, free_slots, free_pages, budget)
        if pairs:
            return [(int(t.handle[v]), int(t.handle[w])) for v, w in pairs]
    victims = _victims(t, config, now_ns, max_context, skip | set(state.restoring))
    chosen: list[int] = []
    pairs: list[tuple[int, int]] = []
    log_ratio = math.log(config.price_ratio)
    # Highest price first: the lowest rate x (f/x), then the earliest handle.
    for w, pages in sorted(zip(waiters, need), key=lambda wp: (float(t.log_x[wp[0]]), int(t.handle[wp[0]]))):
        if free_slots >= 1 and free_pages >= pages:
            free_slots, free_pages = free_slots - 1, free_pages - pages  # it can start without a preemption
            continue
        limit = float(t.log_x[w]) + log_ratio  # a victim's log x must be at least this
        take, slots, got = [], free_slots, free_pages
        for v, left in victims:
            if len(chosen) + len(take) >= budget or (slots >= 1 and got >= pages) or left <= t.max_output[w]:
                break  # (victims come by remaining output: the rest would all finish sooner than w)
            if v in chosen or not float(t.log_x[v]) >= limit:
                continue
            take.append(v)
            slots, got = slots + 1, got + int(t.pages[v])
        if not (slots >= 1 and got >= pages):
            break  # its need cannot be covered now; lower-priced waiters wait behind it
        chosen += take
        pairs += [(int(t.handle[v]), int(t.handle[w])) for v in take]
        free_slots, free_pages = slots - 1, got - pages
        if len(chosen) >= budget:
            break
    return pairs


def release(t: RequestTable, state: StateOperations) -> None:
    """Let a preempted request's restore compete again once the waiter it yielded to holds a
    slot, has ended, or it no longer waits itself (cancelled)."""
    for victim, waiter in list(state.held.items()):
        row = t.index.get(waiter)
        if (row is None or t.phase[row] == DONE or t.slot[row] != NO_SLOT
                or (victim not in state.restoring and victim not in state.captures)):
            del state.held[victim]


def _victims(t: RequestTable, config: PreemptionConfig, now_ns: int, max_context: int, pending,
             quantum_ns: int | None = None) -> list:
    """(row, remaining output) of the decoders that may be preempted, in the victim key order;
    `quantum_ns`: the least residency (None: the config's quantum)."""
    live = t.live_rows()
    rows = live[(t.slot[live] != NO_SLOT) & (t.phase[live] == DECODE)]
    if not len(rows):
        return []
    left = t.output_left(rows)
    room = t.context_tokens(rows) < max_context
    quantum = int(config.quantum_ms * 1e6) if quantum_ns is None else quantum_ns
    resident = now_ns - t.resident_ns[rows] >= quantum
    ok = (left > 0) & room & resident
    keys = [(-int(left[i]), int(t.resident_ns[r]), int(t.handle[r]))
            for i, r in enumerate(rows.tolist()) if ok[i] and int(t.handle[r]) not in pending]
    return [(t.index[h], -neg_left) for neg_left, _, h in sorted(keys)]

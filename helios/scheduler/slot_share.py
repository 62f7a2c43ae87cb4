"""A client's share of the running slots (issue 42; docs/scheduling-utility.md, "Client slot shares").

Fairness prices divide service among requests, not clients: a client with ten requests open holds
ten rows, and once they hold every slot a newcomer from another client waits for one of them to end
(or, worse, behind that client's own waiters, which have waited longer and so are priced higher).
`SchedulerConfig.slot_share` makes the client (`RequestSpec.client`, the tenant of service classes)
a unit of the slots themselves, divided max-min fairly by weight. A client's *level* is the slots
it holds over its weight (its tenant weight; the largest of its live requests', which normally all
carry the same); slots held by preempted rows whose snapshot is pending count as given back.

- Slot admission (`SlotShares.blocked_rows`): when requests of two or more clients wait for slots
  and some are free, the free slots are water-filled among the waiting clients, each next slot to
  the client whose level after taking it is lowest; a client's waiters past what it got (its
  highest-priced first) are held back from the planning view (and their restores from the restore
  candidates). Clients tied at the last level all keep a waiter, and price chooses among them. With
  one waiting client, or no free slot, nothing is held back: a lone client fills every slot.
- Preemption (`share_due`): a waiter that cannot start retires a resident decoder of another
  client whose level after giving it up is still at least the waiter's client's level after
  taking it ((held_g - 1) / w_g >= (held_r + 1) / w_r), from the client with the highest level,
  its lowest-priced row (largest x / w: the row whose service is worth least at the margin).
  Each transfer lowers sum(held^2 / w) by at least 1/w_g, so slots never pass back and forth.

With one client, or waiting clients at equal levels, nothing here acts: decisions are the same
as without it. Pure: no clock, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from helios.scheduler.memo import Memo, by_identity
from helios.scheduler.requests import NO_SLOT, RequestTable

EPS = 1e-9  # levels are slot counts over weights: equal within rounding


@dataclass(frozen=True, slots=True)
class SlotShares:
    """The clients of the live rows at one instant: per live row its client's index and whether
    it waits for a slot, per client the slots it holds and its weight."""

    rows: np.ndarray  # the live rows
    client: np.ndarray  # client index of each live row
    held: np.ndarray  # slots held per client
    weight: np.ndarray  # weight per client
    waits: np.ndarray  # per live row: waiting for a slot

    def blocked_rows(self, t: RequestTable, free_slots: int) -> np.ndarray:
        """Mask over `rows`: the waiters past their client's part of `free_slots` (water-filled by
        level among the waiting clients), each client's highest-priced waiters kept (the lowest
        log x - log w, then the earliest handle)."""
        blocked = np.zeros(len(self.rows), dtype=bool)
        demand = np.bincount(self.client[self.waits], minlength=len(self.held))
        if free_slots < 1 or np.count_nonzero(demand) < 2:
            return blocked
        room = self._water_fill(demand, free_slots)
        waiting = self.waits.nonzero()[0]
        rows = self.rows[waiting]
        taken = np.zeros(len(room), dtype=np.int64)
        for i in waiting[np.lexsort((t.handle[rows], t.log_x[rows] - t.log_w[rows]))].tolist():
            c = self.client[i]
            blocked[i] = taken[c] >= room[c]
            taken[c] += 1
        return blocked

    def _water_fill(self, demand: np.ndarray, slots: int) -> np.ndarray:
        # Each slot to the waiting client whose level after taking it is lowest; then every client
        # with demand left whose next level ties the last one given also gets one (price decides).
        given = np.zeros(len(demand), dtype=np.int64)
        last = None
        for _ in range(slots):
            open_ = (demand - given).nonzero()[0]
            if not len(open_):
                return given
            after = (self.held[open_] + given[open_] + 1) / self.weight[open_]
            c = open_[int(np.argmin(after))]
            given[c] += 1
            last = float(after.min())
        open_ = (demand - given).nonzero()[0]
        tied = open_[(self.held[open_] + given[open_] + 1) / self.weight[open_] <= last + EPS]
        given[tied] += 1
        return given


def slot_shares(t: RequestTable, live: np.ndarray, retiring=frozenset(), memo: Memo | None = None) -> SlotShares | None:
    """The clients of `live` (live_rows()), or None with at most one client (nothing to divide).
    `retiring`: handles of preempted rows whose snapshot is pending (their slot is counted as given
    back, and they wait for it again). `memo`: the scheduler's Memo (the clients of a live-rows
    array are kept with it: they change only when it does)."""
    if len(live) < 2:
        return None
    clients = _clients(t, live) if memo is None else by_identity(memo.clients, live, lambda rows: _clients(t, rows), 8)
    if clients is None:
        return None
    client, weight = clients
    holds = t.slot[live] != NO_SLOT
    if retiring:
        holds &= ~np.isin(t.handle[live], np.fromiter(retiring, np.int64, len(retiring)))
    return SlotShares(live, client, np.bincount(client[holds], minlength=len(weight)), weight, ~holds)


def _clients(t: RequestTable, live: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    # (client index per row, weight per client), or None for a single client.
    names = [t.specs[r].client for r in live.tolist()]
    first = names[0]
    if all(n == first for n in names):  # the common case: one client
        return None
    index: dict[str, int] = {}
    client = np.fromiter((index.setdefault(n, len(index)) for n in names), np.int64, len(names))
    weight = np.zeros(len(index))
    for i, r in enumerate(live.tolist()):
        weight[client[i]] = max(weight[client[i]], t.specs[r].tenant_weight)
    return client, weight


def current_shares(t: RequestTable, captures, memo: Memo | None = None) -> SlotShares | None:
    """slot_shares of the live rows now; `captures`: StateOperations.captures (its preempted
    entries are retiring)."""
    retiring = frozenset(h for h, c in captures.items() if c.preempted) if captures else frozenset()
    return slot_shares(t, t.live_rows(), retiring, memo)


def share_due(t: RequestTable, shares: SlotShares, waiters: list[int], need: dict[int, int], victims: list[int],
              free_slots: int, free_pages: int, budget: int) -> list[tuple[int, int]]:
    """(victim, waiter) rows: for each waiter (`waiters` in price order, visited poorest client
    first) that cannot start in `free_slots` and `free_pages` (its extent `need[row]`), resident
    decoders of richer clients that cover its slot and pages (see the module docstring);
    `victims`: the decoders that may be preempted at all; at most `budget` retirements."""
    held, weight = shares.held.astype(float), shares.weight
    if not victims:
        return []
    pos = {r: i for i, r in enumerate(shares.rows.tolist())}
    of = {v: int(shares.client[pos[v]]) for v in victims}
    lowest = min((held[shares.client[pos[w]]] + 1) / weight[shares.client[pos[w]]] for w in waiters)
    if max((held[c] - 1) / weight[c] for c in set(of.values())) < lowest - EPS:
        return []  # the usual case: no client with a resident decoder is richer than a waiting one
    # Within a client, the lowest price first: the largest log x - log w (w f / x is the row's
    # fairness price), then the most output left (it would hold its slot longest), then the handle.
    left = dict(zip(victims, t.output_left(np.asarray(victims, dtype=np.int64)).tolist()))
    cheap = {v: (float(t.log_x[v]) - float(t.log_w[v]), left[v], -int(t.handle[v])) for v in victims}
    pairs: list[tuple[int, int]] = []
    order = sorted(waiters, key=lambda w: (held[shares.client[pos[w]]] + 1) / weight[shares.client[pos[w]]])
    for w in order:  # sorted() is stable: price order within a level
        r = int(shares.client[pos[w]])
        if free_slots >= 1 and free_pages >= need[w]:
            free_slots, free_pages = free_slots - 1, free_pages - need[w]
            held[r] += 1
            continue  # it starts without a retirement
        take, slots, pages, after = [], free_slots, free_pages, held.copy()
        while len(pairs) + len(take) < budget and not (slots >= 1 and pages >= need[w]):
            floor = (after[r] + 1) / weight[r]
            richer = [v for v in victims
                      if of[v] != r and v not in take and (after[of[v]] - 1) / weight[of[v]] >= floor - EPS]
            if not richer:
                break
            v = max(richer, key=lambda v: (after[of[v]] / weight[of[v]], cheap[v]))
            take.append(v)
            after[of[v]] -= 1
            slots, pages = slots + 1, pages + int(t.pages[v])
        if not (slots >= 1 and pages >= need[w]):
            continue
        victims = [v for v in victims if v not in take]
        pairs += [(v, w) for v in take]
        held = after
        held[r] += 1
        free_slots, free_pages = slots - 1, pages - need[w]
        if len(pairs) >= budget:
            break
    return pairs

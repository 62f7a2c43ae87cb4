"""A client's share of the running slots (issue 42; docs/scheduling-utility.md, "Client slot shares").

Fairness prices divide service among requests, not clients: a client with ten requests open holds
ten rows, and once they hold every slot a newcomer from another client waits for one of them to end
(or, worse, behind that client's own waiters, which have waited longer and so are priced higher).
`SchedulerConfig.slot_share` adds the client (`RequestSpec.client`, the tenant of service classes)
as a unit of the slots themselves:

- a client's share is the slots times its weight over the weights of the clients with a live
  request (equal weights: slots / n); its weight is its tenant weight (the largest of its live
  requests', which normally all carry the same);
- a client is *entitled* to one more slot while it holds at most share - 1, and *over* its share
  while it holds more than its share; slots held by preempted rows whose snapshot is pending are
  already counted as given back;
- slot admission: while a client entitled to a slot has a request waiting for one, each client's
  waiting requests past the slots it is entitled to (its highest-priced first) are held back from
  the planning view (and their restores from the restore candidates). With no entitled waiter
  nothing is held back: the rule is work-conserving toward a lone client, which still fills every
  slot;
- preemption (`share_due`): an entitled client's waiter that cannot start retires a resident
  decoder of a client over its share, its lowest-priced one (largest x / w: the row whose service
  is worth least at the margin), through the same snapshot and restore as price preemption.

Entitled clients hold at most their share after a transfer and the giver stays over or at its own,
so no two clients can take a slot back and forth. With one client, or none over its share, nothing
here acts: decisions are the same as without it. Pure: no clock, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from helios.scheduler.requests import NO_SLOT, RequestTable

EPS = 1e-9  # shares are slots x weight fractions: held + 1 <= share within rounding


@dataclass(frozen=True, slots=True)
class SlotShares:
    """The clients of the live rows at one instant: per live row its client's index, per client
    the slots it holds, its share and whether it has a request waiting for a slot."""

    rows: np.ndarray  # the live rows
    client: np.ndarray  # client index of each live row
    held: np.ndarray  # slots held per client
    share: np.ndarray  # share per client (slots x weight / total weight)
    waits: np.ndarray  # per live row: waiting for a slot

    def entitled(self) -> np.ndarray:
        return self.held + 1 <= self.share + EPS

    def blocked_rows(self, t: RequestTable) -> np.ndarray:
        """Mask over `rows`: while a client entitled to a slot waits, each client's waiters past the
        slots it is entitled to (floor(share - held)), its highest-priced first (the lowest
        log x - log w, then the earliest handle). One plan may hand out several slots (a prefill
        cohort), so a client's whole entitlement is what it may take; what the others leave goes
        by price once no entitled client waits (the next plan)."""
        entitled = self.entitled()
        blocked = np.zeros(len(self.rows), dtype=bool)
        if not entitled[self.client[self.waits]].any():
            return blocked
        room = np.floor(self.share - self.held + EPS).astype(np.int64)
        waiting = self.waits.nonzero()[0]
        rows = self.rows[waiting]
        key = np.lexsort((t.handle[rows], t.log_x[rows] - t.log_w[rows]))  # highest price first
        taken = np.zeros(len(room), dtype=np.int64)
        for i in waiting[key].tolist():
            c = self.client[i]
            if taken[c] >= room[c]:
                blocked[i] = True
            taken[c] += 1
        return blocked


def slot_shares(t: RequestTable, live: np.ndarray, total_slots: int, retiring=frozenset()) -> SlotShares | None:
    """The shares of the clients of `live` (live_rows()), or None with at most one client (nothing
    to divide). `retiring`: handles of preempted rows whose snapshot is pending (their slot is
    counted as given back, and they wait for it again)."""
    if len(live) < 2:
        return None
    names = [t.specs[r].client for r in live.tolist()]
    first = names[0]
    if all(n == first for n in names):  # the common case: one client
        return None
    index: dict[str, int] = {}
    client = np.fromiter((index.setdefault(n, len(index)) for n in names), np.int64, len(names))
    weight = np.zeros(len(index))
    for i, r in enumerate(live.tolist()):
        weight[client[i]] = max(weight[client[i]], t.specs[r].tenant_weight)
    holds = t.slot[live] != NO_SLOT
    if retiring:
        holds &= ~np.isin(t.handle[live], np.fromiter(retiring, np.int64, len(retiring)))
    held = np.bincount(client[holds], minlength=len(index))
    return SlotShares(live, client, held, total_slots * weight / weight.sum(), ~holds)


def share_due(t: RequestTable, shares: SlotShares, waiters: list[int], need: dict[int, int], victims: list[int],
              free_slots: int, free_pages: int, budget: int) -> list[tuple[int, int]]:
    """(victim, waiter) rows: for each waiter in `waiters` (price order) of an entitled client
    that cannot start in `free_slots` and `free_pages` (its extent `need[row]`), the resident
    decoders of clients over their share that cover its slot and pages, lowest-priced first;
    `victims`: the decoders that may be preempted at all; at most `budget` retirements."""
    pos = {r: i for i, r in enumerate(shares.rows.tolist())}
    held = shares.held.astype(float)
    # Lowest price first: the largest log x - log w (w f / x is the row's fairness price), then the
    # most output left (it would hold its slot longest), then the earliest handle.
    left = dict(zip(victims, t.output_left(np.asarray(victims, dtype=np.int64)).tolist())) if victims else {}
    order = sorted(victims, key=lambda v: (-(float(t.log_x[v]) - float(t.log_w[v])), -left[v], int(t.handle[v])))
    pairs: list[tuple[int, int]] = []
    taken: set[int] = set()
    for w in waiters:
        c = shares.client[pos[w]]
        if not held[c] + 1 <= shares.share[c] + EPS:
            continue  # not entitled: price preemption may still serve it
        if free_slots >= 1 and free_pages >= need[w]:
            free_slots, free_pages, held[c] = free_slots - 1, free_pages - need[w], held[c] + 1
            continue  # it starts without a retirement
        take, slots, pages, after = [], free_slots, free_pages, held.copy()
        for v in order:
            if len(pairs) + len(take) >= budget or (slots >= 1 and pages >= need[w]):
                break
            h = shares.client[pos[v]]
            if v in taken or h == c or not after[h] > shares.share[h] + EPS:
                continue
            take.append(v)
            after[h] -= 1
            slots, pages = slots + 1, pages + int(t.pages[v])
        if not (slots >= 1 and pages >= need[w]):
            continue
        taken.update(take)
        pairs += [(v, w) for v in take]
        held = after
        held[c] += 1
        free_slots, free_pages = slots - 1, pages - need[w]
        if len(pairs) >= budget:
            break
    return pairs



def current_shares(t: RequestTable, total_slots: int, captures) -> SlotShares | None:
    """slot_shares of the live rows now; `captures`: StateOperations.captures (its preempted
    entries are retiring)."""
    retiring = frozenset(h for h, c in captures.items() if c.preempted) if captures else frozenset()
    return slot_shares(t, t.live_rows(), total_slots, retiring)

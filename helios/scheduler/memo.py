"""The scheduler's memo of static values: those derived from its shapes (tie-break keys, capacity
orders, surviving cohorts, padding orders, prompt chunks), kept by the shape tuple's id, and the
EWMA's per-interval terms, kept by (interval, tau).

Every decision asks again for the same values of the same long-lived shape tuples, and hashing
them would cost more than the lookup saves, so each value is kept by the object's id. Frame
durations repeat (one estimate per graph), and the EWMA's terms cost microseconds of numpy calls
on scalars (math's functions differ from numpy's in the last bit), so they are reused. One memo
belongs to one Scheduler (Scheduler.memo) and is passed explicitly to the candidate functions:
the pure core holds no module-level state. An entry keeps its object alive, so an id is never
reused while cached.
"""

from __future__ import annotations


class Memo:
    """Per-scheduler caches, each bounded (cleared when full): entries are (object, value) by id."""

    __slots__ = ("keys", "by_capacity", "cohorts", "orders", "survivors", "chunks", "decay", "clients")

    def __init__(self) -> None:
        self.keys: dict[int, tuple] = {}  # shape -> policy.finish_candidate's tie-break fields
        self.by_capacity: dict[int, tuple] = {}  # shape tuple -> shapes by batch capacity
        self.cohorts: dict[tuple, tuple] = {}  # (shape tuple, lane count) -> policy._cohorts
        self.orders: dict[int, tuple] = {}  # mixed shape tuple -> mixed._padding_order
        self.survivors: dict[tuple, tuple] = {}  # (mixed shapes, n, prompt pattern) -> mixed._survivors
        self.chunks: dict[int, tuple] = {}  # prefill shape tuple -> prefill._chunks
        self.decay: dict[tuple[float, float], tuple] = {}  # (delta_ms, tau_ms) -> service._decay_terms
        self.clients: dict[int, tuple] = {}  # live rows array -> slot_share._clients


def by_identity(cache: dict, obj, build, limit: int = 4096):
    """build(obj), computed once per object and kept in `cache` by id(obj) (a Memo dict). The
    entry keeps `obj` alive, so its id is never reused while cached."""
    hit = cache.get(id(obj))
    if hit is None or hit[0] is not obj:
        if len(cache) >= limit:
            cache.clear()
        hit = cache[id(obj)] = (obj, build(obj))
    return hit[1]


"""TorchCore's checkpoint store: KV state copied out of a slot at an exact token endpoint.

A SNAPSHOT graph copies the first `endpoint` positions of a slot's K/V into a host-side entry
keyed by the exact tokens that produced them; a RESTORE graph copies an entry (or its first L
positions) into a fresh slot, after which the request's suffix is prefilled from position L.
Restoring a prefix of an entry is exact: K/V at position p depends only on tokens [0, p].

Memory is bounded (`capacity_bytes`). When an insert does not fit, the allocator's rule picks
victims among unguarded entries: least recent demand first, then checkpoint role (a terminal
capture before a prompt anchor), then the shorter endpoint (less prefill work lost). An entry
that a matched request guards, or that an in-flight restore copies from, is never a victim: the
guard is taken at match time and dropped when the restore ran or the request was detached.

Thread safety: `match` runs on the submitting thread while the core's worker executes
snapshots and restores, so every method takes the store's lock.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field
from enum import IntEnum

import numpy as np
import torch

__all__ = ["CheckpointRole", "CheckpointStats", "CheckpointStore", "Match"]


class CheckpointRole(IntEnum):
    """Eviction order among equally recent entries: lower roles go first."""

    TERMINAL = 0  # a finished response's state: useful only if the conversation continues
    ANCHOR = 1  # a completed message endpoint inside a prompt


@dataclass(slots=True)
class CheckpointStats:
    """Counters for /metrics (flare_checkpoint_*)."""

    hits: int = 0
    misses: int = 0
    evictions: int = 0
    restored_tokens: int = 0
    snapshots: int = 0
    restores: int = 0
    skipped_snapshots: int = 0  # a copy that could not fit even after eviction

    def as_dict(self) -> dict:
        return {name: getattr(self, name) for name in self.__slots__}


@dataclass(slots=True)
class _Entry:
    tokens: np.ndarray  # int64 [endpoint]
    k: torch.Tensor  # [layers, kv_heads, endpoint, head_dim]
    v: torch.Tensor
    role: CheckpointRole
    demand: int  # logical clock of the last insert or match: recency of demand
    guards: int = 0

    @property
    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() * 2


@dataclass(frozen=True, slots=True)
class Match:
    """A guarded entry and how many of its leading tokens the prompt shares."""

    entry: int
    tokens: int


@dataclass
class CheckpointStore:
    """Bounded store of KV checkpoints (see the module docstring for the eviction rule)."""

    capacity_bytes: int
    stats: CheckpointStats = field(default_factory=CheckpointStats)

    def __post_init__(self) -> None:
        if not isinstance(self.capacity_bytes, int) or self.capacity_bytes < 0:
            raise ValueError(f"capacity_bytes must be a nonnegative integer, got {self.capacity_bytes!r}")
        self._entries: dict[int, _Entry] = {}
        self._ids = itertools.count(1)
        self._clock = itertools.count(1)
        self._lock = threading.Lock()
        self.used_bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def guarded(self) -> int:
        """Entries currently protected from eviction (tests: nothing leaks a guard)."""
        with self._lock:
            return sum(1 for e in self._entries.values() if e.guards)

    # ---- lookup --------------------------------------------------------------------------
    def match(self, prompt, min_tokens: int = 1) -> Match | None:
        """The entry sharing the longest token prefix with `prompt` (at most len(prompt) - 1, so
        the last prompt token is always prefilled and samples the first output), guarded until
        `release`. Counts a hit or a miss."""
        ids = np.asarray(prompt, dtype=np.int64)
        limit = len(ids) - 1
        with self._lock:
            best, best_len = None, 0
            for eid, e in self._entries.items():
                n = min(len(e.tokens), limit)
                if n <= best_len:
                    continue
                diff = np.flatnonzero(e.tokens[:n] != ids[:n])
                shared = int(diff[0]) if len(diff) else n
                if shared > best_len:
                    best, best_len = eid, shared
            if best is None or best_len < min_tokens:
                self.stats.misses += 1
                return None
            entry = self._entries[best]
            entry.guards += 1
            entry.demand = next(self._clock)
            self.stats.hits += 1
            return Match(best, best_len)

    def release(self, entry: int) -> None:
        """Drop one guard taken by `match` (restore done, or the request went away)."""
        with self._lock:
            e = self._entries.get(entry)
            if e is not None and e.guards:
                e.guards -= 1

    # ---- copies --------------------------------------------------------------------------
    def save(self, tokens, k: torch.Tensor, v: torch.Tensor, role: CheckpointRole, copy: bool = True) -> bool:
        """Store `k`/`v` ([layers, kv_heads, endpoint, head_dim]; views of a slot are copied to
        the host, `copy=False` keeps host tensors the caller will not modify) as a new entry
        keyed by `tokens`; evict by the allocator's rule to make room. False (nothing stored)
        when it cannot fit even with every unguarded entry evicted."""
        ids = np.asarray(tokens, dtype=np.int64)
        need = k.numel() * k.element_size() * 2
        with self._lock:
            for eid, e in self._entries.items():
                if len(e.tokens) >= len(ids) and np.array_equal(e.tokens[:len(ids)], ids):
                    e.demand = next(self._clock)  # already covered: refresh, copy nothing
                    self.stats.snapshots += 1
                    return True
            if not self._make_room(need):
                self.stats.skipped_snapshots += 1
                return False
            # Host copies: the slot is reused at once, and on CUDA this frees device memory.
            entry = _Entry(ids.copy(), k.to("cpu", copy=copy), v.to("cpu", copy=copy), role, next(self._clock))
            # An unguarded entry whose tokens this one extends is superseded: every match it
            # could serve, the new entry serves at least as far.
            for eid in [eid for eid, e in self._entries.items()
                        if not e.guards and len(e.tokens) < len(ids) and np.array_equal(ids[:len(e.tokens)], e.tokens)]:
                self.used_bytes -= self._entries.pop(eid).nbytes
            self._entries[next(self._ids)] = entry
            self.used_bytes += entry.nbytes
            self.stats.snapshots += 1
            return True

    def load(self, entry: int, tokens: int, k_out: torch.Tensor, v_out: torch.Tensor) -> None:
        """Copy the first `tokens` positions of a guarded entry into `k_out`/`v_out` (slot views)."""
        with self._lock:
            e = self._entries[entry]
            if tokens > len(e.tokens):
                raise ValueError(f"entry holds {len(e.tokens)} tokens; {tokens} requested")
            k_out[:, :, :tokens].copy_(e.k[:, :, :tokens])
            v_out[:, :, :tokens].copy_(e.v[:, :, :tokens])
            e.demand = next(self._clock)
            self.stats.restores += 1
            self.stats.restored_tokens += tokens

    def _make_room(self, need: int) -> bool:
        if need > self.capacity_bytes:
            return False
        free = self.capacity_bytes - self.used_bytes
        if free >= need:
            return True
        victims = sorted((e.demand, int(e.role), len(e.tokens), eid)
                         for eid, e in self._entries.items() if not e.guards)
        chosen = []
        for *_, eid in victims:
            if free >= need:
                break
            free += self._entries[eid].nbytes
            chosen.append(eid)
        if free < need:
            return False  # guarded entries hold the rest: skip this copy, evict nothing
        for eid in chosen:
            self.used_bytes -= self._entries.pop(eid).nbytes
            self.stats.evictions += 1
        return True

"""The scheduler's log of committed plans (`Scheduler.traces`), built when read."""

from __future__ import annotations

from collections import deque

from helios.scheduler.plan import PlanTrace


class TraceLog:
    """The last `maxlen` committed plans, as `PlanTrace`s.

    Commit records each plan's fields as a plain tuple: building the frozen dataclass costs a few
    microseconds per decision, and most runs never read the log. Reading an entry builds its
    `PlanTrace` once and keeps it, so every read returns the same object (a baseline adds fields
    to the last one's `extra` after commit).
    """

    def __init__(self, maxlen: int, refresh_den: int, learning_den: int):
        self._items: deque = deque(maxlen=maxlen)
        self._dens = refresh_den, learning_den

    @property
    def maxlen(self) -> int:
        return self._items.maxlen

    def record(self, fields: tuple) -> None:
        """`fields`: fence, shape, handle list, estimate, observation age, reason, score, log scale,
        commit time, and each exploration ledger's credit in ledger units (credit_ns * den)."""
        self._items.append(fields)

    def _build(self, item):
        if type(item) is not tuple:
            return item
        fence, shape, handles, est, age, reason, score, log_scale, now, refresh, learning = item
        # The same division as Ledger.credit_ns, on the units the ledger held at commit.
        if type(handles) is not list:  # a plan's read-only handle column (commit's fast path)
            handles = handles.tolist()
        return PlanTrace(fence, shape, tuple(handles), est, age, reason, score, log_scale, now,
                         refresh_credit_ns=refresh / self._dens[0], learning_credit_ns=learning / self._dens[1])

    def _build_all(self) -> None:
        if any(type(item) is tuple for item in self._items):
            self._items = deque(map(self._build, self._items), maxlen=self._items.maxlen)

    def __len__(self) -> int:
        return len(self._items)

    def __getitem__(self, i: int) -> PlanTrace:
        item = self._items[i]
        if type(item) is tuple:
            item = self._items[i] = self._build(item)
        return item

    def __iter__(self):
        self._build_all()
        return iter(list(self._items))  # a snapshot, as a deque's iterator forbids appends meanwhile

    def __reversed__(self):
        self._build_all()
        return reversed(list(self._items))

    def __repr__(self) -> str:
        return f"TraceLog({list(self)!r})"

"""Plain frozen data exchanged through the scheduler protocol."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from enum import Enum
from typing import Iterator, NamedTuple, Sequence

import numpy as np

from helios.errors import InvalidRequest
from helios.graphs import GraphKind, GraphShape

RequestHandle = int
Fence = int


class FinishReason(Enum):
    EOS = "stop"
    STOP = "stop_string"  # host-side stop string, reported by the runtime through cancel()
    LENGTH = "length"
    CONTEXT = "context"
    CANCELLED = "cancelled"
    ERROR = "error"


class SelectionReason(Enum):
    """Execution classes, as exposed by flare_scheduler_executions_total."""

    ORDINARY = "ordinary"
    DISCOVERY = "discovery"
    TIMING_REFRESH = "timing_refresh"
    ACCEPTANCE_LEARNING = "acceptance_learning"


NO_SLOT = 1 << 30  # slot value of a request without a state slot; sorts after every slot


class Lane(NamedTuple):
    """One request's logical work in a plan, frozen at planning time (one row of `PlanLanes`)."""

    handle: RequestHandle
    epoch: int
    version: int
    slot: int | None  # None until commit assigns one to a request that is not yet resident
    prompt_start: int  # committed-plus-queued prompt cursor when planned
    prompt_tokens: int  # prompt tokens this graph consumes
    context_tokens: int  # KV entries in the slot before this graph
    output_rows: int  # target positions that may commit output tokens
    expected_tokens: float
    expected_deliveries: float
    value: float  # scaled lane value, including the served-decoder age credit
    needs_feedback: bool = False
    predicted_rows: int = 1  # speculative: rows the host expects (== output_rows when it allocates)


# dtype instances, not scalar types: comparing an array's dtype to an instance is several
# times cheaper, and every plan checks its 13 columns.
_LANE_DTYPES = {name: np.dtype(t) for name, t in dict(
    handle=np.int64, epoch=np.int64, version=np.int64, slot=np.int64, prompt_start=np.int64,
    prompt_tokens=np.int64, context_tokens=np.int64, output_rows=np.int64,
    expected_tokens=np.float64, expected_deliveries=np.float64, value=np.float64,
    needs_feedback=np.bool_, predicted_rows=np.int64).items()}
_set = object.__setattr__


@dataclass(frozen=True, slots=True, eq=False)
class PlanLanes:
    """A plan's lanes as one read-only array per `Lane` field (element i of each is lane i),
    the way vLLM V1's CachedRequestData holds a step's requests. `slot` holds NO_SLOT for a
    request that gets its slot at commit. Iterating or indexing yields `Lane` tuples."""

    handle: np.ndarray
    epoch: np.ndarray
    version: np.ndarray
    slot: np.ndarray
    prompt_start: np.ndarray
    prompt_tokens: np.ndarray
    context_tokens: np.ndarray
    output_rows: np.ndarray
    expected_tokens: np.ndarray
    expected_deliveries: np.ndarray
    value: np.ndarray
    needs_feedback: np.ndarray
    predicted_rows: np.ndarray

    def __post_init__(self) -> None:
        n = len(self.handle)
        for name, dtype in _LANE_DTYPES.items():
            arr = getattr(self, name)
            if type(arr) is not np.ndarray or arr.dtype != dtype:
                arr = np.asarray(arr, dtype=dtype)
                object.__setattr__(self, name, arr)
            if arr.shape != (n,):
                raise InvalidRequest(f"plan lane field {name} has shape {arr.shape}, expected ({n},)")
            arr.setflags(write=False)  # the plan is frozen data: so are its columns

    @staticmethod
    def built(*columns: np.ndarray) -> "PlanLanes":
        """Columns in field order that lane building (scheduler/lanes.py) made read-only, with the
        right dtypes and length: kept without re-checking them, most of a plan's construction cost."""
        lanes = object.__new__(PlanLanes)
        for name, arr in zip(_LANE_DTYPES, columns):
            _set(lanes, name, arr)
        return lanes

    @staticmethod
    def of(lanes: Sequence[Lane]) -> "PlanLanes":
        """Columns from a sequence of lanes (None slots become NO_SLOT)."""
        lanes = [Lane(*l) for l in lanes]
        cols = list(zip(*lanes)) if lanes else [()] * len(_LANE_DTYPES)
        values = dict(zip(_LANE_DTYPES, cols))
        values["slot"] = [NO_SLOT if s is None else s for s in values["slot"]]
        return PlanLanes(**{k: np.array(v, dtype=_LANE_DTYPES[k]) for k, v in values.items()})

    def __len__(self) -> int:
        return len(self.handle)

    def __iter__(self) -> Iterator[Lane]:
        cols = [getattr(self, name).tolist() for name in _LANE_DTYPES]
        cols[3] = [None if s == NO_SLOT else s for s in cols[3]]
        return map(Lane, *cols)

    def __getitem__(self, i: int) -> Lane:
        lane = Lane(*(getattr(self, name)[i].item() for name in _LANE_DTYPES))
        return lane._replace(slot=None) if lane.slot == NO_SLOT else lane

    def __eq__(self, other) -> bool:
        return isinstance(other, PlanLanes) and all(
            np.array_equal(getattr(self, k), getattr(other, k)) for k in _LANE_DTYPES)

    __hash__ = None


@dataclass(frozen=True, slots=True)
class ScheduledPlan:
    """A frozen choice: physical shape, lane work, epochs, estimated duration and score."""

    shape: GraphShape
    lanes: PlanLanes  # a sequence of Lane is converted to columns
    estimated_duration_ns: int | None  # None: indeterminate (discovery)
    score: float  # scaled value rate (or scaled value for an unknown duration)
    log_scale: float
    reason: SelectionReason
    requires_feedback: bool
    stale_cost: bool
    planned_ns: int
    start_ns: int  # planning start time: the queue's expected end
    queue_fences: tuple[Fence, ...]
    device_allocation: bool = False  # D > 0 program whose target rows the device allocates
    # The planner's own record of the lanes' table rows: (table, stamp, lanes, rows). Commit trusts
    # it while the stamp says no call has changed the table since planning (Scheduler.commit).
    resolved: tuple | None = field(default=None, compare=False, repr=False)
    # A vision window's snapshot or restore (vision.py): a private row that publishes no
    # prefix-cache entry and needs no host caching.
    private_state: bool = False
    # A nonterminal SNAPSHOT at a conversation anchor (anchors.py): the request keeps its slot and
    # continues; the copy is published as a prefix-cache anchor entry (or skipped without room).
    anchor: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.lanes, PlanLanes):
            object.__setattr__(self, "lanes", PlanLanes.of(self.lanes))
        if self.shape.kind is GraphKind.MIXED:
            _check_mixed_roles(self.shape, self.lanes)

    def __reduce__(self):
        # A plan travels (pickled to tensor-parallel ranks, copied) without the planner's resolved
        # rows: they name the scheduler's own table, and commit checks a plan without them in full.
        return _rebuild_plan, ({f.name: getattr(self, f.name) for f in fields(self) if f.name != "resolved"},)

    def selection_value_rate(self) -> float:
        return self.score

    def selection_log_scale(self) -> float:
        return self.log_scale

    @property
    def handles(self) -> tuple[RequestHandle, ...]:
        return tuple(self.lanes.handle.tolist())

    @property
    def prefill_row(self) -> int | None:
        """Mixed plans: index in the dense lane list of the first row that consumes prompt tokens
        (None: no prompt row). Every other row of a mixed plan with one prompt row is a decode or
        speculative row with prompt_tokens == 0. Helios puts the prompt rows first (0 when
        present); a consumer must read the index rather than assume it. Separate-family plans
        have no prefill role and return None. `prefill_rows` names every prompt row."""
        rows = self.prefill_rows
        return rows[0] if rows else None

    @property
    def prefill_rows(self) -> tuple[int, ...]:
        """Mixed plans: the dense lane indices of every prompt row (at most shape.prompt_rows,
        one in the spec's form), in packed order; () otherwise."""
        if self.shape.kind is not GraphKind.MIXED:
            return ()
        return tuple(np.flatnonzero(self.lanes.prompt_tokens).tolist())

    def padding(self) -> int:
        if self.shape.kind is GraphKind.MIXED:  # the packed extent: the prompt row plus W-wide rows
            return self.shape.max_packed_extent - int(self.lanes.prompt_tokens.sum()) - int(
                np.where(self.lanes.prompt_tokens > 0, 0, self.lanes.output_rows).sum())
        used = sum(np.maximum(self.lanes.prompt_tokens, self.lanes.output_rows).tolist())
        return self.shape.target_capacity - used


def _check_mixed_roles(shape: GraphShape, lanes: PlanLanes) -> None:
    """Mixed lane roles: at most B rows, at most shape.prompt_rows prompt rows (one in the spec's
    form) whose tokens share the prompt capacity C (each prompt row's output rows 0 or 1), decode
    rows of 1..W output rows."""
    n, b = len(lanes), shape.batch_capacity
    if n > b:
        raise InvalidRequest(f"{shape.label()} has {b} rows; the plan has {n} lanes")
    prompt = lanes.prompt_tokens
    rows = np.flatnonzero(prompt)
    limit = shape.prompt_rows
    if len(rows) > limit or int(prompt.min(initial=0)) < 0:
        what = "one prompt row" if limit == 1 else f"{limit} prompt rows"
        raise InvalidRequest(f"{shape.label()}: at most {what}, got {len(rows)}")
    if len(rows) and (int(prompt[rows].sum()) > shape.prefill_capacity or int(lanes.output_rows[rows].max()) > 1):
        what = "the prompt row exceeds its" if limit == 1 else "the prompt rows exceed their packed"
        raise InvalidRequest(f"{shape.label()}: {what} capacity or output row")
    decode = np.delete(lanes.output_rows, rows)
    if len(decode) and (int(decode.min()) < 1 or int(decode.max()) > shape.token_capacity):
        raise InvalidRequest(f"{shape.label()}: decode rows have 1..{shape.token_capacity} output rows")


@dataclass(frozen=True, slots=True)
class CompletionRecord:
    """A core's report for one lane of a completed fence."""

    handle: RequestHandle
    epoch: int
    prompt_tokens: int
    tokens: tuple[int, ...] = ()
    eos: bool = False
    offered: int | None = None  # speculative: draft positions verified (None: the lane's full prefix)


@dataclass(frozen=True, slots=True)
class ExecutionTiming:
    """Per-rank device intervals, an optional exposed readiness delay, and host wall time."""

    rank_intervals_ns: tuple[int | None, ...] = ()
    readiness_delay_ns: int | None = None
    wall_ns: int | None = None

    def device_interval_ns(self) -> int | None:
        """The maximum positive rank-local interval; None when no rank reported one."""
        positive = [i for i in self.rank_intervals_ns if i is not None and i > 0]
        return max(positive) if positive else None

    def cost_sample_ns(self) -> int | None:
        """Raw device observation minus exposed readiness delay (after aggregating ranks)."""
        interval = self.device_interval_ns()
        if interval is None:
            return None
        sample = interval - (self.readiness_delay_ns or 0)
        return sample if sample > 0 else None

    def validate(self) -> str | None:
        for i in self.rank_intervals_ns:
            if i is not None and (not isinstance(i, int) or i < 0):
                return f"rank interval must be a nonnegative integer or None, got {i!r}"
        for name in ("readiness_delay_ns", "wall_ns"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or v < 0):
                return f"{name} must be a nonnegative integer or None, got {v!r}"
        return None


class GeneratedToken(NamedTuple):
    """Tokens committed for one request by one completion, for the runtime to publish.

    An immutable named tuple rather than a frozen dataclass: completion builds one per lane,
    and a tuple is built at a fraction of the cost."""

    handle: RequestHandle
    fence: Fence
    tokens: tuple[int, ...]
    finish: FinishReason | None = None
    first: bool = False


@dataclass(frozen=True, slots=True)
class PlanTrace:
    """What a committed plan looked like, for logs and the simulator's report."""

    fence: Fence
    shape: GraphShape
    handles: tuple[RequestHandle, ...]
    estimated_duration_ns: int | None
    observation_age_ns: int | None
    reason: SelectionReason
    score: float
    log_scale: float
    committed_ns: int
    extra: dict = field(default_factory=dict)
    # Each exploration ledger's credit at commit (ns; negative is debt), before this plan's episode.
    refresh_credit_ns: float | None = None
    learning_credit_ns: float | None = None


def _rebuild_plan(fields_by_name: dict) -> ScheduledPlan:
    """Unpickling and copying: by name, so the field order cannot misplace a value."""
    return ScheduledPlan(**fields_by_name)

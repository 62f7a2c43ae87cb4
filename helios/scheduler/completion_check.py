"""Completion validation: every lane of a completed frame is checked before anything is mutated."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain

import numpy as np

from helios.errors import InvalidCompletion
from helios.graphs import GraphKind
from helios.scheduler.plan import CompletionRecord, ExecutionTiming
from helios.scheduler.queue import ExecutionQueue, Frame
from helios.scheduler.requests import DONE, RequestTable
from helios.scheduler.utility import count_nonzero


@dataclass(slots=True)
class Checked:
    """A validated completion: the frame and its records as lane-aligned columns."""

    frame: Frame
    records: list
    tokens: list  # each lane's token tuple, as plain ints
    token_counts: np.ndarray
    eos: np.ndarray | None  # None: no lane reported eos (the usual case)
    prompt: bool  # some lane consumed prompt tokens
    all_produced: bool  # every lane committed at least one token
    single: bool  # every lane committed exactly one token (a plain decode step)
    handles: list | None = None  # the lanes' handles as a list, when validation read them so


_RECORD, _TUPLE, _INT = frozenset((CompletionRecord,)), frozenset((tuple,)), frozenset((int,))


def validate_completion(queue: ExecutionQueue, table: RequestTable, fence, records, timing,
                        confidence=None, survival=None, sidecar_shape=None) -> Checked:
    head = queue.head()
    if head is None or fence != head.fence:
        if fence in queue.fences():
            raise InvalidCompletion(f"fence {fence} completed out of order (oldest is {head.fence})")
        raise InvalidCompletion(f"fence {fence!r} is not in flight (unknown or already completed)")
    if not isinstance(timing, ExecutionTiming):
        raise InvalidCompletion("timing must be an ExecutionTiming")
    problem = timing.validate()
    if problem:
        raise InvalidCompletion(problem)
    lanes = head.plan.lanes
    if not isinstance(records, (list, tuple)) or len(records) != len(lanes):
        raise InvalidCompletion(f"fence {fence} has {len(lanes)} lanes; got {len(records) if isinstance(records, (list, tuple)) else records!r}")
    kind = head.plan.shape.kind
    speculative = kind is GraphKind.SPECULATIVE
    # Rows whose token count is an accepted prefix: speculative rounds and wider mixed decode rows.
    rounds = speculative or (kind is GraphKind.MIXED and head.plan.shape.token_capacity > 1)
    records = list(records)
    # One set of lane rules (_lane_problem). _columns checks the same rules on whole columns for
    # the common form, a measured cache of them (issue 45: 64 decode lanes in 32 us against 176 us
    # lane by lane, more than the rest of a decision); tests/scheduler/test_completion_rules.py
    # shows both accept the same records.
    checked = _columns(lanes, records, lambda: (table.phase[head.rows] != DONE).tolist(), rounds)
    if checked is not None:
        tokens, counts, eos, handles, live, as_planned = checked
        single = counts.count(1) == len(counts)
        all_produced = single or 0 not in counts
        # Usually one token per output row: the plan's column is the count column.
        counts = lanes.output_rows if as_planned else np.fromiter(counts, np.int64, len(counts))
        eos = np.fromiter(eos, bool, len(eos)) if any(eos) else None
    else:
        handles = None
        live = table.phase[head.rows] != DONE
        _first_problem(lanes, records, live, rounds)  # raises, unless only the types differ
        tokens = [tuple(map(int, r.tokens)) for r in records]
        counts = np.fromiter((len(r.tokens) for r in records), np.int64, len(records))
        eos = np.fromiter((r.eos for r in records), bool, len(records))
        all_produced = bool(count_nonzero(counts) == len(counts))
        single = all_produced and bool(count_nonzero(counts == 1) == len(counts))
    if speculative or kind is GraphKind.MIXED:
        live = table.phase[head.rows] != DONE if live is None else np.asarray(live)
        if speculative:
            for lane, rec, is_live in zip(lanes, records, live.tolist()):
                _validate_round(head.plan, lane, rec, is_live, survival)
        else:
            _validate_mixed(head.plan, lanes, records, live, survival)
    if head.plan.device_allocation:
        if confidence is None:
            raise InvalidCompletion("a device-allocated speculative round completes through complete_packed_round")
        used = sum(_offered(l, r) + 1 for l, r in zip(lanes, records))
        if used > head.plan.shape.target_capacity:
            raise InvalidCompletion(f"allocated {used} target rows; the program has {head.plan.shape.target_capacity}")
    if confidence is not None:
        _validate_sidecars(confidence, sidecar_shape)
    if survival is not None and not rounds:
        raise InvalidCompletion("survival rows belong to speculative rounds")
    return Checked(head, records, tokens, counts, eos, bool(count_nonzero(lanes.prompt_tokens)),
                   all_produced, single, handles)


def _columns(lanes, records: list, live_of, rounds: bool):
    """The rules of `_lane_problem` on whole columns, with C-level builtins, for the common form:
    CompletionRecords holding tuples of Python ints. Returns (tokens, counts, eos, handles, live,
    as_planned) as lists (live None when no rule needed it; `live_of()` reads it; as_planned: every
    count is its lane's output rows), or None when some record
    is in another form or breaks a rule: `_first_problem` then names the problem, or accepts a
    record whose only difference is its types (numpy integers)."""
    if not set(map(type, records)) <= _RECORD:
        return None
    tokens = [r.tokens for r in records]
    handles = lanes.handle.tolist()
    if not (set(map(type, tokens)) <= _TUPLE
            and [r.handle for r in records] == handles
            and [r.epoch for r in records] == lanes.epoch.tolist()
            and [r.prompt_tokens for r in records] == lanes.prompt_tokens.tolist()):
        return None
    flat = list(chain.from_iterable(tokens))
    counts = list(map(len, tokens))
    eos = [r.eos for r in records]
    if not set(map(type, flat)) <= _INT or (flat and min(flat) < 0):
        return None
    if any(eos) and any(e and not c for e, c in zip(eos, counts)):  # eos needs a token
        return None
    live = None
    rows = lanes.output_rows.tolist()
    as_planned = counts == rows  # usually one token per output row
    if not rounds and not as_planned:
        # A lane finished or cancelled in flight may return fewer tokens than its rows.
        live = live_of()
        if not all(c <= r and (c == r or not l) for c, r, l in zip(counts, rows, live)):
            return None
    return tokens, counts, eos, handles, live, as_planned


def _first_problem(lanes, records, live, rounds) -> None:
    """The lane-by-lane checks, in order: raises for the first bad record."""
    for lane, rec, is_live in zip(lanes, records, live.tolist()):
        problem = _lane_problem(lane, rec, is_live, rounds)
        if problem is not None:
            raise InvalidCompletion(problem)


def _lane_problem(lane, rec, is_live: bool, rounds: bool) -> str | None:
    """The rules every lane's record must meet, or None when it does. `rounds`: an accepted
    prefix (speculative rounds, wider mixed decode rows) is checked by _validate_round instead."""
    if type(rec) is not CompletionRecord:
        return f"not a CompletionRecord: {rec!r}"
    if rec.handle != lane.handle or rec.epoch != lane.epoch:
        return (f"record for request {rec.handle} epoch {rec.epoch} does not match "
                f"lane {lane.handle} epoch {lane.epoch}")
    if rec.prompt_tokens != lane.prompt_tokens:
        return f"request {rec.handle}: consumed {rec.prompt_tokens} prompt tokens, scheduled {lane.prompt_tokens}"
    if type(rec.tokens) is not tuple or not _token_ids(rec.tokens):
        return f"request {rec.handle}: tokens must be a tuple of nonnegative ints"
    if not rounds and (len(rec.tokens) > lane.output_rows or (is_live and len(rec.tokens) != lane.output_rows)):
        return f"request {rec.handle}: {len(rec.tokens)} tokens for {lane.output_rows} output rows"
    if rec.eos and not rec.tokens:
        return f"request {rec.handle}: eos without a token"
    return None


def _token_ids(tokens: tuple) -> bool:
    return all(isinstance(t, (int, np.integer)) and not isinstance(t, bool) and t >= 0 for t in tokens)


def _offered(lane, rec) -> int:
    return lane.output_rows - 1 if rec.offered is None else rec.offered


def _validate_round(plan, lane, rec, live, survival) -> None:
    offered = _offered(lane, rec)
    if not isinstance(offered, int) or not 0 <= offered <= lane.output_rows - 1:
        raise InvalidCompletion(f"request {rec.handle}: offered {rec.offered!r} outside 0..{lane.output_rows - 1}")
    if len(rec.tokens) > offered + 1 or (live and not rec.tokens):
        raise InvalidCompletion(f"request {rec.handle}: {len(rec.tokens)} tokens for {offered} verified proposals")
    rows = None if survival is None else survival.get(rec.handle)
    if rows is not None:
        arr = np.asarray(rows, dtype=float)
        if arr.ndim != 1 or len(arr) > offered or not np.all(np.isfinite(arr)) or np.any(arr < 0) \
                or np.any(arr > 1) or np.any(np.diff(arr) > 1e-6):
            raise InvalidCompletion(f"request {rec.handle}: survival rows must be nonincreasing "
                                    f"probabilities for at most {offered} evaluated prefixes")


def _validate_mixed(plan, lanes, records, live, survival) -> None:
    """Completion by phase. Each prompt row commits its full scheduled extent (checked with every
    lane's prompt_tokens) and publishes its first token only when that chunk finishes the prompt;
    a width-one decode row commits its one token (checked with every lane), a wider one its
    accepted prefix."""
    prompt_rows, wide = plan.prefill_rows, plan.shape.token_capacity > 1
    for i, (lane, rec, is_live) in enumerate(zip(lanes, records, live.tolist())):
        if i not in prompt_rows:
            if wide:
                _validate_round(plan, lane, rec, is_live, survival)
            continue
        n = len(rec.tokens)
        if n > lane.output_rows or (is_live and n != lane.output_rows):
            raise InvalidCompletion(f"request {rec.handle}: a mixed graph's prompt row returned {n} tokens "
                                    f"for {lane.output_rows} output rows")
        if rec.offered is not None or (survival is not None and rec.handle in survival):
            raise InvalidCompletion(f"request {rec.handle}: a prompt row verifies no proposals")


def _validate_sidecars(confidence, shape) -> None:
    sidecars = confidence if isinstance(confidence, (list, tuple)) else [confidence]
    if not sidecars:
        raise InvalidCompletion("a packed round needs rank 0's confidence sidecar")
    for rank, sc in enumerate(sidecars):
        if not isinstance(sc, np.ndarray) or sc.dtype != np.float32 or sc.shape != shape:
            raise InvalidCompletion(f"rank {rank} confidence must be float32 of shape {shape}")
        if not np.all(np.isfinite(sc)) or np.any(sc < 0) or np.any(sc > 1):
            raise InvalidCompletion(f"rank {rank} confidence holds values outside [0, 1]")

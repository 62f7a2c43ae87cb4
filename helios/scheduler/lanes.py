"""Lane building and the plan's feedback rule, shared by Helios and every baseline.

A selector (Helios's value-rate selection or a baseline's) picks a shape and table rows; the
plan's lane columns are then read off the request table here, in one place.
"""

from __future__ import annotations

from dataclasses import fields

import numpy as np

from helios.graphs import GraphKind, GraphShape
from helios.scheduler.cost import CostState
from helios.scheduler.plan import PlanLanes
from helios.scheduler.requests import RequestTable
from helios.scheduler.utility import count_nonzero


def _filled(value, dtype):
    arr = np.full(256, value, dtype=dtype)
    arr.setflags(write=False)
    return arr


# Constant lane columns as read-only slices of shared arrays (no allocation per plan).
# Keyed by the scalar type callers pass: no dtype conversion per lookup.
_CONSTANTS = {(v, d): _filled(v, d) for v in (0, 1) for d in (np.int64, np.float64, np.bool_)}


def _const(value, dtype, n: int) -> np.ndarray:
    arr = _CONSTANTS[(value, dtype)]
    return arr[:n] if n <= len(arr) else np.full(n, value, dtype=dtype)


_DECODE_COLUMNS = ((0, np.int64), (1, np.int64), (1, np.float64), (0, np.float64), (0, np.bool_))


# decode_lanes' constant columns for each lane count up to 256 (selection is bounded to 64 slots),
# read-only slices of the shared arrays: a static table built once, not a cache.
_DECODE_CONSTANTS = tuple(tuple(_CONSTANTS[c][:n] for c in _DECODE_COLUMNS) for n in range(257))


def _decode_constants(n: int) -> tuple:
    """(zeros, ones, float ones, float zeros, all false), read-only, n long."""
    if n < len(_DECODE_CONSTANTS):
        return _DECODE_CONSTANTS[n]
    out = tuple(np.full(n, v, dtype=d) for v, d in _DECODE_COLUMNS)
    for arr in out:
        arr.setflags(write=False)
    return out


def _common(t: RequestTable, rows: np.ndarray) -> dict:
    cursor = t.prompt_done[rows] + t.queued_prompt[rows]
    return dict(handle=t.handle[rows], epoch=t.epoch[rows], version=t.version[rows], slot=t.slot[rows],
                prompt_start=cursor, context_tokens=cursor + t.output_done[rows] + t.queued_output[rows])


def decode_lanes(t: RequestTable, rows: np.ndarray, values: np.ndarray | None = None,
                 cursor: np.ndarray | None = None, produced: np.ndarray | None = None) -> PlanLanes:
    """One output row per lane; `values` are the scaled lane values (zero for baselines).
    `cursor` and `produced`: the rows' committed-plus-queued prompt and output, when the caller
    has them (the same integers the table gives)."""
    zeros, ones, one, zero, false = _decode_constants(len(rows))
    # The hot path's columns all come from the table or the read-only constants, with their
    # dtypes: built without re-checking them (only `values` comes from the caller).
    if cursor is None:
        cursor = t.prompt_done[rows] + t.queued_prompt[rows]
        context = cursor + t.output_done[rows] + t.queued_output[rows]
    else:
        context = cursor + produced
    fresh = (t.handle[rows], t.epoch[rows], t.version[rows], t.slot[rows], cursor, context,
             zero if values is None else np.asarray(values, np.float64))
    # A host-feedback request with a fence in flight needs that fence's result first; without
    # such a request the column is the shared all-false constant (the same values).
    feedback = t.host_feedback[rows]
    if count_nonzero(feedback):
        feedback &= t.inflight[rows] > 0
        feedback.setflags(write=False)
    else:
        feedback = false
    for arr in fresh:
        arr.setflags(write=False)
    handle, epoch, version, slot, start, context, value = fresh
    return PlanLanes.built(handle, epoch, version, slot, start, zeros, context, ones, one, one, value, feedback, ones)


def prefill_lanes(t: RequestTable, rows: np.ndarray, works: np.ndarray) -> PlanLanes:
    """`works` prompt tokens per lane. A finishing chunk commits its prompt and can publish one
    first output token."""
    n = len(rows)
    works = np.asarray(works, dtype=np.int64)
    finishes = (works == t.prompt_left(rows)).astype(np.int64)
    return PlanLanes(**_common(t, rows), prompt_tokens=works, output_rows=finishes,
                     expected_tokens=(works + finishes).astype(float), expected_deliveries=_const(0, np.float64, n),
                     value=_const(0, np.float64, n), needs_feedback=_const(0, np.bool_, n),
                     predicted_rows=_const(1, np.int64, n))


def speculative_lanes(t: RequestTable, rows: np.ndarray, bounds: np.ndarray, expected: np.ndarray,
                      values: np.ndarray, predicted: np.ndarray) -> PlanLanes:
    """A queued lane can advance by at most `bounds` = min(ceiling, P) tokens."""
    n = len(rows)
    return PlanLanes(**_common(t, rows), prompt_tokens=_const(0, np.int64, n), output_rows=bounds,
                     expected_tokens=expected, expected_deliveries=_const(1, np.float64, n), value=values,
                     needs_feedback=t.host_feedback[rows] & (t.inflight[rows] > 0), predicted_rows=predicted)


def packed_lanes(t: RequestTable, rows: np.ndarray, works: np.ndarray) -> PlanLanes:
    """A packed varlen forward (GraphKind.PACKED): a decode lane where `works` is 0, a prompt chunk
    of `works` tokens elsewhere, in the given order."""
    works = np.asarray(works, dtype=np.int64)
    decode, prefill, is_decode = decode_lanes(t, rows), prefill_lanes(t, rows, works), works == 0
    return PlanLanes(**{f.name: np.where(is_decode, getattr(decode, f.name), getattr(prefill, f.name))
                        for f in fields(PlanLanes)})


def ordinary_lanes(t: RequestTable, shape: GraphShape, rows: np.ndarray, works: np.ndarray) -> PlanLanes:
    """Unpriced lanes for a baseline's (shape, rows, prompt tokens) choice."""
    rows = np.asarray(rows, dtype=np.int64)
    if shape.kind is GraphKind.PACKED:
        return packed_lanes(t, rows, works)
    return prefill_lanes(t, rows, works) if shape.kind.is_prefill else decode_lanes(t, rows)


def requires_feedback(shape: GraphShape, state: CostState, lanes: PlanLanes) -> bool:
    """A plan needs an empty window when its graph cannot queue, its cost is not fresh, or a
    lane needs host feedback."""
    return not shape.kind.queueable or state is not CostState.FRESH or count_nonzero(lanes.needs_feedback) > 0


def state_lanes(t: RequestTable, rows: np.ndarray, context, values) -> PlanLanes:
    """Lanes of a state operation (snapshot, restore, vision): no prompt consumed, no output row;
    `context` is the exact endpoint each lane copies, restores or writes."""
    n = len(rows)
    zeros = np.zeros(n, dtype=np.int64)
    return PlanLanes(handle=t.handle[rows], epoch=t.epoch[rows], version=t.version[rows], slot=t.slot[rows],
                     prompt_start=t.prompt_done[rows] + t.queued_prompt[rows], prompt_tokens=zeros,
                     context_tokens=np.asarray(context, dtype=np.int64), output_rows=zeros,
                     expected_tokens=np.zeros(n), expected_deliveries=np.zeros(n),
                     value=np.asarray(values, dtype=float), needs_feedback=np.zeros(n, dtype=bool),
                     predicted_rows=np.ones(n, dtype=np.int64))

"""Completion: validation of every lane before any mutation, then cost learning, service
accounting and progress, vectorized over the frame's lanes."""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import chain, compress, repeat

import numpy as np

from helios.config import PromptRateLaw
from helios.errors import InvalidCompletion
from helios.graphs import GraphKind
from helios.scheduler.accounting import account_interval
from helios.scheduler.service import first_token_progress
from helios.scheduler.plan import (
    NO_SLOT, CompletionRecord, ExecutionTiming, FinishReason, GeneratedToken, SelectionReason,
)
from helios.scheduler.queue import ExecutionQueue, Frame
from helios.scheduler.requests import DONE, RequestTable
from helios.scheduler.utility import count_nonzero


@dataclass(slots=True)
class ExecutionStats:
    """flare_scheduler_execution_nanoseconds_total / _executions_total by execution class."""

    nanoseconds: dict = field(default_factory=lambda: {r: 0 for r in SelectionReason})
    executions: dict = field(default_factory=lambda: {r: 0 for r in SelectionReason})
    by_shape: dict = field(default_factory=dict)  # GraphShape -> executions
    # flare_speculative_*: complete programs, not separate proposal and target calls.
    speculative_programs: int = 0
    speculative_offered: int = 0  # draft positions verified
    speculative_accepted: int = 0
    speculative_emitted: int = 0  # committed tokens, bonus/replacement included
    speculative_learned_draws: int = 0  # learned proposals only; copy proposals draw nothing

    def record(self, frame: Frame, raw_ns: int | None) -> None:
        self.executions[frame.reason] += 1
        self.nanoseconds[frame.reason] += raw_ns or 0
        shape = frame.plan.shape
        self.by_shape[shape] = self.by_shape.get(shape, 0) + 1


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
    live = None  # phase column at the lanes' rows, read only where a check needs it
    # The common case, checked on whole columns with C-level builtins: CompletionRecords with
    # tuples of nonnegative ints, the lanes' handles, epochs and prompt tokens, and token counts
    # that fit the lanes. Anything else takes the lane-by-lane checks (_first_problem).
    fast = set(map(type, records)) <= _RECORD
    handles = None
    if fast:
        tokens = [r.tokens for r in records]
        handles = lanes.handle.tolist()
        fast = (set(map(type, tokens)) <= _TUPLE
                and [r.handle for r in records] == handles
                and [r.epoch for r in records] == lanes.epoch.tolist()
                and [r.prompt_tokens for r in records] == lanes.prompt_tokens.tolist())
    if fast:
        flat = list(chain.from_iterable(tokens))
        counts = list(map(len, tokens))
        eos = [r.eos for r in records]
        any_eos = any(eos)
        fast = (set(map(type, flat)) <= _INT and (not flat or min(flat) >= 0)
                and not (any_eos and any(e and not c for e, c in zip(eos, counts))))  # eos needs a token
        rows = lanes.output_rows.tolist()
        as_planned = counts == rows  # usually one token per output row
        if fast and not rounds and not as_planned:
            # A lane finished or cancelled in flight may return fewer tokens than its rows.
            live = (table.phase[head.rows] != DONE).tolist()
            fast = all(c <= r and (c == r or not l) for c, r, l in zip(counts, rows, live))
    if fast:
        single = counts.count(1) == len(counts)
        all_produced = single or 0 not in counts
        # Usually one token per output row: the plan's column is the count column.
        counts = lanes.output_rows if as_planned else np.fromiter(counts, np.int64, len(counts))
        eos = np.fromiter(eos, bool, len(eos)) if any_eos else None
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


def _first_problem(lanes, records, live, speculative) -> None:
    """The lane-by-lane checks, in order, for the first bad record's message."""
    for lane, rec, is_live in zip(lanes, records, live.tolist()):
        if type(rec) is not CompletionRecord:
            raise InvalidCompletion(f"not a CompletionRecord: {rec!r}")
        if rec.handle != lane.handle or rec.epoch != lane.epoch:
            raise InvalidCompletion(f"record for request {rec.handle} epoch {rec.epoch} does not match "
                                    f"lane {lane.handle} epoch {lane.epoch}")
        if rec.prompt_tokens != lane.prompt_tokens:
            raise InvalidCompletion(f"request {rec.handle}: consumed {rec.prompt_tokens} prompt tokens, "
                                    f"scheduled {lane.prompt_tokens}")
        if type(rec.tokens) is not tuple or not _token_ids(rec.tokens):
            raise InvalidCompletion(f"request {rec.handle}: tokens must be a tuple of nonnegative ints")
        if not speculative and (len(rec.tokens) > lane.output_rows or (is_live and len(rec.tokens) != lane.output_rows)):
            raise InvalidCompletion(f"request {rec.handle}: {len(rec.tokens)} tokens for "
                                    f"{lane.output_rows} output rows")
        if rec.eos and not rec.tokens:
            raise InvalidCompletion(f"request {rec.handle}: eos without a token")


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
    """Completion by phase. The prompt row commits its full scheduled extent (checked with every
    lane's prompt_tokens) and publishes its first token only when that chunk finishes the prompt;
    a width-one decode row commits its one token (checked with every lane), a wider one its
    accepted prefix."""
    prompt_row, wide = plan.prefill_row, plan.shape.token_capacity > 1
    for i, (lane, rec, is_live) in enumerate(zip(lanes, records, live.tolist())):
        if i != prompt_row:
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


def apply_completion(sched, checked: Checked, timing: ExecutionTiming,
                     confidence=None, survival=None) -> tuple[list[GeneratedToken], bool, tuple | None]:
    """Apply a validated completion. Returns the tokens to publish, whether some lane of the
    frame is done (cancelled before, or finished now): only then can a lane's row retire, and
    (handles, rows) of the bursts when there is one per lane (else None), in burst order."""
    frame, records, counts = checked.frame, checked.records, checked.token_counts
    now, t = sched.now_ns, sched.requests
    plan, shape = frame.plan, frame.plan.shape
    lanes, rows = plan.lanes, frame.rows
    # Nothing finished or was rebound since commit: every lane is live in its planned epoch and
    # every participant still holds its request (RequestTable.turnover).
    intact = frame.turnover == t.turnover
    interval = timing.device_interval_ns()
    # timing.cost_sample_ns(), from the interval already aggregated over ranks.
    sample = None if interval is None else interval - (timing.readiness_delay_ns or 0)
    sched.costs.observe(shape, sample if sample is not None and sample > 0 else None, now)
    raw = interval
    if frame.isolated and timing.wall_ns:
        raw = max(raw or 0, timing.wall_ns)
    sched.stats.record(frame, raw)
    sched.exploration.completed(frame.reason, frame.fence, raw, interval is not None, plan.estimated_duration_ns)
    rounds = shape.kind is GraphKind.SPECULATIVE or (shape.kind is GraphKind.MIXED and shape.token_capacity > 1)
    if rounds:
        sched.stats.speculative_programs += 1
    prompt = checked.prompt
    # Each successful frame with a positive device interval is one measured interval.
    if interval is not None:
        # Without prompt tokens the normalized service is the token counts (0 * r_d/r_p + count,
        # the same floats); one token each is ewma_log's one-per-lane form (log 1 = 0, same values).
        # On the laws that count only what the user received, a chunk is no service (OUTPUT_EWMA;
        # on FIRST_OUTPUT the mean law below replaces the prompt rows' EWMA anyway).
        law = sched.policy.prompt_rate_law
        credited = lanes.prompt_tokens if law.credits_prompt else 0
        served = (frame.normalizers.normalized_service(credited, counts) if prompt
                  else 1.0 if checked.single else counts)
        # Rows on the mean-rate law count progress toward their first token instead (service.py).
        progress = (first_token_progress(lanes.prompt_tokens, t.prompt_tokens[rows], counts,
                                         law.credits_prompt) if t.mean_law_rows else None)
        account_interval(t, frame, served, None if checked.all_produced else counts, raw / 1e6,
                         sched.policy.adaptation_ms, intact,
                         law is PromptRateLaw.UNTIL_SERVED, progress)
    if prompt:
        t.queued_prompt[rows] -= lanes.prompt_tokens
    t.queued_output[rows] -= lanes.output_rows
    t.inflight[rows] -= 1
    t.version[rows] += 1
    # Cancelled or already finished lanes: their results are discarded.
    act = None if intact else (t.phase[rows] != DONE) & (t.epoch[rows] == lanes.epoch)
    whole = intact or count_nonzero(act) == len(act)
    if whole:
        r, n, lane_index = rows, counts, None
    else:
        r, n, lane_index = rows[act], counts[act], act.nonzero()[0].tolist()
    produced = None if checked.all_produced else n > 0  # None: every lane produced
    before = t.output_done[r]
    first = before == 0
    if produced is not None:
        first &= produced
    if prompt:
        t.prompt_done[r] += lanes.prompt_tokens if whole else lanes.prompt_tokens[act]
    after = before + n  # what `+=` would store, without gathering the column a second time
    t.output_done[r] = after
    published = t.has_publication[r]
    # Usually every lane has published before: no mask to build.
    unpublished = None if produced is None and count_nonzero(published) == len(published) else ~published
    if unpublished is not None and produced is not None:
        unpublished &= produced
    if unpublished is not None and count_nonzero(unpublished):
        provisional = r[unpublished]  # provisional until the runtime publishes
        t.last_publication_ns[provisional] = now
        t.has_publication[provisional] = True
    length = after >= t.max_output[r]
    finishing = length | (t.prompt_done[r] + after >= sched.config.max_context)
    eos = checked.eos
    if eos is not None:
        eos = eos if whole else eos[act]
        finishing |= eos
    finished = finishing.nonzero()[0].tolist() if count_nonzero(finishing) else ()
    for i in finished:
        reason = (FinishReason.EOS if eos is not None and eos[i] else FinishReason.LENGTH if length[i]
                  else FinishReason.CONTEXT)
        t.set_finish(int(r[i]), reason)
    if finished or prompt:  # only a finish or prompt progress moves a phase
        t.update_phase(r)
    if rounds:
        _learn_round(sched, frame, records, np.arange(len(r)) if lane_index is None else act.nonzero()[0], r,
                     confidence, survival)
    handles, tokens = checked.handles, checked.tokens
    if lane_index is not None:
        handles, tokens = lanes.handle[act].tolist(), [tokens[j] for j in lane_index]
    elif handles is None:
        handles = lanes.handle.tolist()
    # A live lane has no finish reason until set_finish gives it one (which makes it done).
    finishes = map(t.finish.__getitem__, r.tolist()) if finished else repeat(None)
    # GeneratedTokens built by tuple.__new__ over zipped columns: a named tuple's own __new__
    # is a Python call per lane.
    out = map(tuple.__new__, repeat(GeneratedToken), zip(
        handles, repeat(frame.fence), tokens, finishes, first.tolist()))
    if produced is not None:  # a lane that produced nothing publishes only its finish
        return list(compress(out, (produced | finishing).tolist())), not whole or bool(finished), None
    return list(out), not whole or bool(finished), (handles, r)


def _learn_round(sched, frame, records, index: np.ndarray, rows: np.ndarray, confidence, survival) -> None:
    """Acceptance and confidence learning from a completed round: lanes `index` of the plan, on
    request rows `rows`, all at once (distinct requests, in lane order)."""
    t, lanes = sched.requests, frame.plan.lanes
    learns = lanes.prompt_tokens[index] == 0  # a mixed graph's prompt row learns no acceptance
    index, rows = index[learns], rows[learns]
    if not len(index):
        return
    recs = [records[j] for j in index.tolist()]
    output_rows = lanes.output_rows[index]
    offered = np.fromiter((o - 1 if rec.offered is None else rec.offered
                           for rec, o in zip(recs, output_rows.tolist())), dtype=np.int64, count=len(recs))
    emitted = np.fromiter((len(rec.tokens) for rec in recs), dtype=np.int64, count=len(recs))
    accepted = np.maximum(emitted - 1, 0)
    stats = sched.stats
    stats.speculative_offered += int(offered.sum())
    stats.speculative_accepted += int(accepted.sum())
    stats.speculative_emitted += int(emitted.sum())
    depth = frame.plan.shape.proposal_depth
    if sched.source.value == "learned":
        stats.speculative_learned_draws += depth * len(recs)
    generated = t.output_done[rows]
    censored = np.fromiter((t.finish[row] is not None for row in rows.tolist()), dtype=bool, count=len(recs))
    given = None if survival is None else [survival.get(rec.handle) for rec in recs]
    if given is not None:
        given = [None if g is None else np.asarray(g, dtype=float) for g in given]
    sched.speculation.observe_rounds(t.speculation, rows, sched.source, generated, accepted, offered, censored,
                                     given)
    if confidence is not None:
        rank0 = confidence[0] if isinstance(confidence, (list, tuple)) else confidence
        slots = lanes.slot[index]
        placed = slots != NO_SLOT
        # Forecast observations stop at the lane's frozen min(D + 1, W) ceiling.
        joint = rank0[1, slots[placed], :depth].astype(float)
        lengths = np.minimum(min(depth, joint.shape[1]), output_rows[placed] - 1)
        sched.speculation.observe_confidences(t.speculation, rows[placed], generated[placed], joint, lengths)

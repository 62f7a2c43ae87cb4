"""Completion: after validation (completion_check.py) and before any other mutation, cost learning,
service accounting and progress, vectorized over the frame's lanes."""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import compress, repeat

import numpy as np

from helios.config import PromptRateLaw
from helios.graphs import GraphKind
from helios.scheduler.accounting import account_interval
from helios.scheduler.completion_check import Checked
from helios.scheduler.plan import NO_SLOT, ExecutionTiming, FinishReason, GeneratedToken, SelectionReason
from helios.scheduler.queue import Frame
from helios.scheduler.requests import DONE
from helios.scheduler.service import first_token_progress
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


def apply_completion(ex, checked: Checked, timing: ExecutionTiming, confidence, survival,
                     now: int) -> tuple[list[GeneratedToken], bool, tuple | None]:
    """Apply a validated completion. Returns the tokens to publish, whether some lane of the
    frame is done (cancelled before, or finished now): only then can a lane's row retire, and
    (handles, rows) of the bursts when there is one per lane (else None), in burst order."""
    frame, records, counts = checked.frame, checked.records, checked.token_counts
    t = ex.requests
    plan, shape = frame.plan, frame.plan.shape
    lanes, rows = plan.lanes, frame.rows
    # Nothing finished or was rebound since commit: every lane is live in its planned epoch and
    # every participant still holds its request (RequestTable.turnover).
    intact = frame.turnover == t.turnover
    interval, raw = _learn_cost(ex, frame, timing, now)
    rounds = shape.kind is GraphKind.SPECULATIVE or (shape.kind is GraphKind.MIXED and shape.token_capacity > 1)
    if rounds:
        ex.stats.speculative_programs += 1
    prompt = checked.prompt
    # Each successful frame with a positive device interval is one measured interval.
    if interval is not None:
        _account_service(ex, checked, raw, intact)
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
    finishing = length | (t.prompt_done[r] + after >= ex.config.max_context)
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
        _learn_round(ex, frame, records, np.arange(len(r)) if lane_index is None else act.nonzero()[0], r,
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


def _learn_cost(ex, frame: Frame, timing: ExecutionTiming, now: int) -> tuple[int | None, int | None]:
    """Spec, "Duration estimates" and "Funded timing refresh": the cost sample (the device interval
    less readiness stalls) updates the graph's estimate; the raw interval (and wall time for an
    isolated frame) is what execution statistics and the exploration ledgers count. Returns the
    device interval and the raw duration (None: no valid interval)."""
    interval = timing.device_interval_ns()
    # timing.cost_sample_ns(), from the interval already aggregated over ranks.
    sample = None if interval is None else interval - (timing.readiness_delay_ns or 0)
    ex.costs.observe(frame.plan.shape, sample if sample is not None and sample > 0 else None, now)
    raw = interval
    if frame.isolated and timing.wall_ns:
        raw = max(raw or 0, timing.wall_ns)
    ex.stats.record(frame, raw)
    ex.exploration.completed(frame.reason, frame.fence, raw, interval is not None,
                                frame.plan.estimated_duration_ns)
    return interval, raw


def _account_service(ex, checked: Checked, raw: int, intact: bool) -> None:
    """Spec, "Service accounting and publication": one measured interval of every participant's
    service, in the frame's commit-time normalizers. Without prompt tokens the normalized service
    is the token counts (0 * r_d/r_p + count, the same floats); one token each is ewma_log's
    one-per-lane form (log 1 = 0, same values). On the laws that count only what the user
    received, a chunk is no service (OUTPUT_EWMA; on FIRST_OUTPUT the mean law replaces the prompt
    rows' EWMA anyway)."""
    t, frame, counts = ex.requests, checked.frame, checked.token_counts
    lanes = frame.plan.lanes
    law = ex.study.prompt_rate_law
    credited = t.credited_prompt(frame.rows, lanes.prompt_tokens, law.credits_prompt)
    served = (frame.normalizers.normalized_service(credited, counts) if checked.prompt
              else 1.0 if checked.single else counts)
    # Rows on the mean-rate law count progress toward their first token instead (service.py).
    progress = (first_token_progress(lanes.prompt_tokens, t.prompt_tokens[frame.rows], counts,
                                     law.credits_prompt) if t.mean_law_rows else None)
    account_interval(t, frame, served, None if checked.all_produced else counts, raw / 1e6,
                     ex.policy.adaptation_ms, intact,
                     law is PromptRateLaw.UNTIL_SERVED, progress, ex.memo.decay)


def _learn_round(ex, frame, records, index: np.ndarray, rows: np.ndarray, confidence, survival) -> None:
    """Acceptance and confidence learning from a completed round: lanes `index` of the plan, on
    request rows `rows`, all at once (distinct requests, in lane order)."""
    t, lanes = ex.requests, frame.plan.lanes
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
    stats = ex.stats
    stats.speculative_offered += int(offered.sum())
    stats.speculative_accepted += int(accepted.sum())
    stats.speculative_emitted += int(emitted.sum())
    depth = frame.plan.shape.proposal_depth
    if ex.source.value == "learned":
        stats.speculative_learned_draws += depth * len(recs)
    generated = t.output_done[rows]
    censored = np.fromiter((t.finish[row] is not None for row in rows.tolist()), dtype=bool, count=len(recs))
    given = None if survival is None else [survival.get(rec.handle) for rec in recs]
    if given is not None:
        given = [None if g is None else np.asarray(g, dtype=float) for g in given]
    ex.speculation.observe_rounds(t.speculation, rows, ex.source, generated, accepted, offered, censored,
                                     given)
    if confidence is not None:
        rank0 = confidence[0] if isinstance(confidence, (list, tuple)) else confidence
        slots = lanes.slot[index]
        placed = slots != NO_SLOT
        # Forecast observations stop at the lane's frozen min(D + 1, W) ceiling.
        joint = rank0[1, slots[placed], :depth].astype(float)
        lengths = np.minimum(min(depth, joint.shape[1]), output_rows[placed] - 1)
        ex.speculation.observe_confidences(t.speculation, rows[placed], generated[placed], joint, lengths)

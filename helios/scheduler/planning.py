"""From the request table to lane pools: projection to the queue's end, prices, scale."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from helios.config import PolicyConfig, PromptRateLaw, StudyConfig
from helios.graphs import GraphKind
from helios.scheduler.plan import NO_SLOT
from helios.scheduler.policy import Deferred, LanePool
from helios.scheduler.queue import ExecutionQueue
from helios.scheduler.requests import DECODE, PREFILL, RequestTable
from helios.scheduler.resources import ResourcePool
from helios.scheduler.service import (Normalizers, PriceCoefficients, ewma_log, first_token_progress, log_prices,
                                      mean_rate_log)
from helios.scheduler.utility import DecodeReference, count_nonzero, shared_log_scale


_NO_ROWS = np.zeros(0, dtype=np.int64)
_NO_ROWS.setflags(write=False)


@dataclass(slots=True)
class PlanningView:
    log_scale: float
    waiting: float  # scaled sum of c over active decoders
    decode: LanePool  # decoders, with speculative arrays filled when speculation is loaded
    decode_rows: np.ndarray  # table row of each decode pool entry
    prefill: dict[GraphKind, tuple[LanePool, np.ndarray]]  # pool and table rows per prefill kind
    # When the decode pool is every row in table order: its prompt cursors and produced outputs
    # (committed plus queued), which decode lanes would otherwise read back from the table.
    decode_cursor: np.ndarray | None = None
    decode_produced: np.ndarray | None = None
    # Handles held back by client slot shares (scheduler/slot_share.py): their restores wait too.
    held_out: frozenset = frozenset()


def project_rates(t: RequestTable, rows: np.ndarray, queue: ExecutionQueue, tau_ms: float,
                  law: PromptRateLaw = PromptRateLaw.EWMA, memo: dict | None = None):
    """Copies of the log token/delivery rates of `rows` advanced through every queued frame's
    expected service, and each row's expected delivery time (has, ns) from the queue (None, None
    when the queue is empty).

    Observed history changes only at completion; this projection never touches it. Rows on the
    mean-rate law are projected on it, as `accounting.account_interval` will count them.
    """
    n = len(rows)
    log_x, log_z = t.log_x[rows], t.log_z[rows]
    tau = t.taus(rows, tau_ms)  # a scalar, or each row's own (class prices)
    own = isinstance(tau, np.ndarray)
    if not len(queue):
        return log_x, log_z, None, None  # nothing queued: no expected delivery either
    has_delivery = np.zeros(n, dtype=bool)
    delivery_ns = np.zeros(n, dtype=np.int64)
    pos = np.full(t.capacity, -1, dtype=np.int64)
    pos[rows] = np.arange(n)
    window = t.rate_window_ms[rows] if t.mean_law_rows else None  # a copy: fancy indexing
    for frame in queue.frames:
        d = frame.expected_ms
        if d is None:
            continue
        pr = frame.participant_rows
        p = pos[pr[t.handle[pr] == frame.participant_handles]]
        p = p[p >= 0]
        lanes = frame.plan.lanes
        lp = pos[frame.rows]
        mine = lp >= 0
        tokens, deliveries = np.zeros(n), np.zeros(n)
        # Expected service in the frame's own commit-time normalizers, as completion will count it.
        tokens[lp[mine]] = frame.normalizers.normalized_service(
            t.credited_prompt(frame.rows[mine], lanes.prompt_tokens[mine], law.credits_prompt),
            lanes.expected_tokens[mine] - lanes.prompt_tokens[mine])
        deliveries[lp[mine]] = lanes.expected_deliveries[mine]
        delivered = lp[mine & (lanes.expected_deliveries > 0)]
        has_delivery[delivered] = True
        delivery_ns[delivered] = frame.expected_end_ns
        before = log_x[p]
        log_x[p] = ewma_log(before, d, tokens[p], tau[p] if own else tau, memo)
        if window is not None:  # prompts on the mean-rate law, as completion will count them
            progress = np.zeros(n)
            progress[lp[mine]] = first_token_progress(
                lanes.prompt_tokens[mine], t.prompt_tokens[frame.rows[mine]],
                lanes.expected_tokens[mine] - lanes.prompt_tokens[mine], law.credits_prompt)
            on = window[p] == window[p]
            m = p[on]
            log_x[m] = mean_rate_log(before[on], window[m], d, progress[m])
            window[m] += d
            if law is PromptRateLaw.UNTIL_SERVED:
                window[m[progress[m] > 0]] = np.nan
        zp = p[~np.isnan(log_z[p])]
        log_z[zp] = ewma_log(log_z[zp], d, deliveries[zp], tau[zp] if own else tau, memo)
    return log_x, log_z, has_delivery, delivery_ns


def build_view(t: RequestTable, rows: np.ndarray, queue: ExecutionQueue, policy: PolicyConfig, study: StudyConfig,
               coeff: PriceCoefficients, decode: DecodeReference, norm: Normalizers,
               resources: ResourcePool, start_ns: int, max_context: int, max_lanes: int,
               speculation=None, scale_floor: float = -math.inf, defer_prompts: bool = True,
               memo: dict | None = None) -> PlanningView:
    """`rows`: live requests in admission order; `decode`: the measured delivery-bearing graphs;
    `norm`: the current reference rates.
    `speculation` is (SpeculationModel, ProposalSource) when speculative programs are loaded.
    `scale_floor`: the largest log price of lanes priced outside these pools (pending restores),
    so they share the decision's scale. `defer_prompts`: price prefill graphs with the deferred step
    (only when a mixed graph could carry the decoders along; docs/scheduling-utility.md section 4).
    `memo`: the scheduler's Memo.decay (the EWMA's terms per interval).

    The steps follow the spec's "Useful service and selection": rates projected to the queue's
    end, the lanes each family could serve (bounded to 64), their prices and one shared scale,
    the decoders' values with their age credit c sigma (A + T), then the study's stall prices and
    deferred step, and the prompt pools."""
    log_x, log_z, has_delivery, delivery_ns = project_rates(
        t, rows, queue, policy.adaptation_ms, study.prompt_rate_law, memo)
    phase, handles, max_output, act = t.live_columns(rows)  # act: the decoding positions
    cursor = t.prompt_done[rows] + t.queued_prompt[rows]
    produced = t.output_done[rows] + t.queued_output[rows]
    dec, pre = _servable(t, rows, phase, act, cursor, produced, max_output, max_context, resources)
    # Prompt prices are elementwise: computed only when some prompt can be served.
    lp, lo, ld, lf = log_prices(log_x, log_z, coeff, norm, study.gradient_prompt_price, with_prompt=len(pre) > 0,
                                log_w=t.log_weights(rows))
    truncated = len(dec) > max_lanes
    if truncated:  # the 64-slot bound: keep the highest-priced streams
        dec = dec[np.lexsort((handles[dec], -lo[dec]))][:max_lanes]
    if len(pre) > max_lanes:
        pre = pre[np.lexsort((handles[pre], -lp[pre], t.slot[rows[pre]] == NO_SLOT))][:max_lanes]

    # Indexing by every row, or by the same rows twice, is skipped (the steady state: every
    # request decodes): the values are the same, only copies are saved. dec is a sorted subset
    # of act unless truncated, so with equal lengths they are the same rows.
    everyone = len(act) == len(rows)
    same = not truncated and len(dec) == len(act)
    lo_act, ld_act = (lo, ld) if everyone else (lo[act], ld[act])
    lo_dec, ld_dec = (lo_act, ld_act) if same else (lo[dec], ld[dec])
    # Every decode lane is active (dec is a subset of act), so the decode pool's prices cannot
    # raise the maximum over the active ones: the same scale with fewer arrays.
    scale = shared_log_scale(lp[pre], lo[pre], lo_act, ld_act) if len(pre) else shared_log_scale(lo_act, ld_act)
    if math.isfinite(scale_floor) and scale_floor > scale:
        scale = scale_floor
    s = math.exp(-scale)
    c = policy.decode_age_price
    n_active = len(act)
    sigma = decode.sigma(n_active)
    c_sigma = c * sigma * s if sigma is not None else 0.0

    whole = everyone and same  # the decode pool is every row, in table order
    drows = rows if whole else rows[dec]
    ages = _output_ages(t, drows, dec, queue, has_delivery, delivery_ns, start_ns)
    # The scale is the largest of these logs, so no exponent overflows.
    output_value = np.exp(lo_dec - scale)
    delivery_dec = np.exp(ld_dec - scale)
    base = output_value + delivery_dec + c_sigma * ages
    pool = LanePool(handles if whole else handles[dec], t.last_served_seq[drows], t.slot[drows], base,
                    age_slope=c_sigma)
    stall_total = 0.0
    if study.stall_pricing and len(act):
        stall_total = _price_stalls(pool, t, rows, act, drows, lf if everyone else lf[act],
                                    delivery_dec if same else np.exp(ld_act - scale), scale, same,
                                    policy.adaptation_ms)
        if study.served_stall_pricing:
            pool.steps = decode.steps
    pool.stall_total, pool.tau_ms = stall_total, policy.adaptation_ms
    if study.deferred_step_pricing and len(base):
        pool.deferred = Deferred(float(np.add.reduce(base)), len(base), c_sigma, decode.steps)
    if speculation is not None:
        _add_speculation(pool, t, drows, output_value, speculation, policy, max_context)
    prefill = _prompt_pools(t, rows, pre, handles, lp - scale, lo - scale, resources, pool, stall_total,
                            policy, study, decode, act, start_ns, defer_prompts) if len(pre) else {}
    return PlanningView(scale, c * s * n_active, pool, drows, prefill, *((cursor, produced) if whole else ()))


def _servable(t: RequestTable, rows, phase, act, cursor, produced, max_output, max_context,
              resources: ResourcePool) -> tuple[np.ndarray, np.ndarray]:
    """Positions of the decoders with output and context left, and of the prompts with unqueued
    tokens, nothing queued, and a slot or room for one (`_admissible`)."""
    room = (produced < max_output) & (cursor + produced < max_context)
    if len(act) == len(rows):  # everyone decodes (the steady state): no prompt to consider
        return room.nonzero()[0], _NO_ROWS  # every row is active: the same rows without the mask
    dec = ((phase == DECODE) & room).nonzero()[0]
    pre = ((phase == PREFILL) & (t.queued_prompt[rows] == 0) & (cursor < t.prompt_tokens[rows])).nonzero()[0]
    return dec, _admissible(t, rows, pre, resources)


def _output_ages(t: RequestTable, drows, dec, queue, has_delivery, delivery_ns, start_ns: int) -> np.ndarray:
    """A_i in ms at the planning start: from the last visible output, or from a queued expected
    delivery, which restarts the projected age; zero before a first publication."""
    ref, known = t.last_publication_ns[drows], t.has_publication[drows]
    if len(queue):
        ref = np.where(has_delivery[dec], delivery_ns[dec], ref)
        known = known | has_delivery[dec]
    ages = np.maximum(0, start_ns - ref) / 1e6
    if count_nonzero(known) != len(known):  # skipped in the steady state, where every decoder has published
        ages[~known] = 0.0
    return ages


def _price_stalls(pool: LanePool, t: RequestTable, rows, act, drows, lf_act, delivery_act, scale: float,
                  same: bool, tau_ms: float) -> float:
    """What a stall of T does to a decoder's own prices (StudyConfig.stall_pricing): its fairness
    and delivery prices grow by e^(T/tau) (x and z decay unserved), the law a waiting prompt's
    price follows. Its next step's value grows by (f/x + g/z)(e^(T/tau) - 1); policy.finish_candidate
    charges that to every candidate that leaves the decoder out (docs/scheduling-utility.md).
    Sets the decode pool's growing prices; returns their sum over every active decoder.

    With class prices a decoder's own tau_i sets its growth, e^(T/tau_i) - 1, which does not factor
    over one shared g(T). Each price is weighted by tau / tau_i instead: the same growth to first
    order in T (exact slope at T = 0), so one charge g(T) = e^(T/tau) - 1 still prices every candidate."""
    growing = np.exp(lf_act - scale) + delivery_act
    if t.class_rows:
        growing = growing * (tau_ms / t.tau_ms[rows[act]])
    if same:
        pool.stall = growing  # the decode pool is every active row, in the same order
    else:
        where = np.full(t.capacity, -1, dtype=np.int64)
        where[rows[act]] = np.arange(len(act))
        pool.stall = growing[where[drows]]
    return float(np.add.reduce(growing))  # growing.sum(), without its wrapper


def _prompt_pools(t: RequestTable, rows, pre, handles, log_prefill, log_output, resources: ResourcePool,
                  decode_pool: LanePool, stall_total: float, policy: PolicyConfig, study: StudyConfig,
                  decode: DecodeReference, act, start_ns: int, defer_prompts: bool) -> dict:
    """One pool per prompt kind (prefill, scored prefill): scaled prompt-token and first-token
    values, what is left to the prompt and its next endpoint, residency and page extents."""
    prefill: dict[GraphKind, tuple[LanePool, np.ndarray]] = {}
    for kind in (GraphKind.PREFILL, GraphKind.SCORED_PREFILL):
        idx = pre[t.score_prompt[rows[pre]] == (kind is GraphKind.SCORED_PREFILL)]
        if not len(idx):
            continue
        prow = rows[idx]
        prompts = LanePool(
            handles[idx], t.last_served_seq[prow], t.slot[prow], np.zeros(len(idx)),
            log_prefill=log_prefill[idx],
            first_token=np.exp(log_output[idx]),
            prompt_left=t.prompt_left(prow),
            to_endpoint=t.to_endpoint(prow),
            resident=t.slot[prow] != NO_SLOT,
            pages=resources.extent_pages_of(t, prow),
        )
        prompts.stall_total, prompts.tau_ms = stall_total, policy.adaptation_ms  # a prompt serves no decoder
        if defer_prompts:
            prompts.deferred = decode_pool.deferred
        if study.stall_bound_ms is not None or study.class_gap_bound is not None:
            prompts.stall_step_ms = decode.steps[1] or 0.0  # the fastest delivery-bearing graph
            prompts.stall_bound_ms = _stall_headroom(study, t, rows[act], start_ns, prompts.stall_step_ms)
        prefill[kind] = (prompts, prow)
    return prefill


def _admissible(t: RequestTable, rows: np.ndarray, pre: np.ndarray, resources: ResourcePool) -> np.ndarray:
    """The prompts some candidate could serve now: resident ones, and those without a slot whose
    extent fits when a slot is free. The others would only set the shared scale: with prices
    growing as e^(W/tau), a prompt that has waited W longer outprices the lanes that can run by
    W/tau in log, every candidate's value underflows to zero, and ties go to the shortest graph
    (a 1-row decode, over and over, under overload)."""
    if not len(pre):
        return pre
    homeless = t.slot[rows[pre]] == NO_SLOT
    if not homeless.any():
        return pre
    keep = ~homeless
    if resources.free_slots:
        keep[homeless] = resources.extent_pages_of(t, rows[pre[homeless]]) <= resources.free_pages
    return pre[keep]


def _add_speculation(pool: LanePool, t: RequestTable, rows: np.ndarray, extra_value, speculation, policy,
                     max_context):
    model, source = speculation
    pool.extra_value = extra_value
    pool.survival = model.survival(t.speculation, rows, source)
    pool.survival_alpha = pool.survival ** policy.adaptive_verification_alpha
    forecast = model.forecast(t.speculation, rows)
    # The device admits causal frontiers; a nonincreasing envelope keeps the prediction causal.
    pool.forecast = np.minimum.accumulate(forecast, axis=1)
    pool.limit = np.minimum(t.output_left(rows), max_context - t.context_tokens(rows))


def _stall_headroom(study: StudyConfig, t: RequestTable, active_rows: np.ndarray, start_ns: int,
                    step_ms: float) -> float | None:
    """The off-by-default duration bounds (`StudyConfig.stall_bound_ms`, `class_gap_bound`, outside
    the spec): how long a prefill may run so that every decoder's age + T + one decode step
    (`step_ms`, the fastest) stays within its bound. None when no active decoder has one."""
    known = active_rows[t.has_publication[active_rows]]
    if not len(known):
        return None
    ages = np.maximum(0.0, (start_ns - t.last_publication_ns[known].astype(np.float64)) / 1e6)
    bound = np.full(len(known), math.inf if study.stall_bound_ms is None else float(study.stall_bound_ms))
    if study.class_gap_bound is not None:  # a stated gap target binds its decoder (NaN: none stated)
        own = study.class_gap_bound * t.gap_target_ms[known]
        bound = np.where(np.isnan(own), bound, np.minimum(bound, own))
    headroom = float((bound - ages).min())
    return None if headroom == math.inf else headroom - step_ms

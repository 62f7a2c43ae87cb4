"""From live request state to lane pools: projection to the queue's end, prices, scale."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from helios.config import PolicyConfig
from helios.graphs import GraphKind
from helios.scheduler.policy import LanePool
from helios.scheduler.queue import ExecutionQueue
from helios.scheduler.requests import Phase, Request, ResourcePool
from helios.scheduler.service import PriceCoefficients, log_prices
from helios.scheduler.utility import reference_interval_ms, shared_log_scale

NO_SLOT = 1 << 30


@dataclass(slots=True)
class PlanningView:
    log_scale: float
    waiting: float  # scaled sum of c over active decoders
    sigma_ms: float | None
    decode: LanePool  # decoders, with speculative arrays filled when speculation is loaded
    decode_reqs: list[Request]
    prefill: dict[GraphKind, tuple[LanePool, list[Request]]]


def project_rates(live: list[Request], queue: ExecutionQueue, tau_ms: float):
    """Copies of log token/delivery rates advanced through every queued frame's expected
    service, and each request's expected delivery time (None when nothing is queued).

    Observed history changes only at completion; this projection never touches it.
    """
    log_x = np.fromiter((r.history.log_x for r in live), float, len(live))
    log_z = np.fromiter((math.nan if r.history.log_z is None else r.history.log_z for r in live),
                        float, len(live))
    expected_delivery = [None] * len(live)
    if not len(queue):
        return log_x, log_z, expected_delivery
    index = {r.handle: i for i, r in enumerate(live)}
    for frame in queue.frames:
        d = frame.expected_ms
        if d is None:
            continue
        decay, keep = d / tau_ms, -math.expm1(-d / tau_ms)
        participants = [index[h] for h, _ in frame.participants if h in index]
        tokens = np.zeros(len(live))
        deliveries = np.zeros(len(live))
        for h, (tok, dlv) in frame.expected.items():
            i = index.get(h)
            if i is not None:
                tokens[i], deliveries[i] = tok, dlv
                if dlv > 0:
                    expected_delivery[i] = frame.expected_end_ns
        p = np.asarray(participants, dtype=np.int64)
        with np.errstate(divide="ignore"):
            log_x[p] = np.logaddexp(log_x[p] - decay, np.log(keep * tokens[p] / d))
            has_z = ~np.isnan(log_z[p])
            zp = p[has_z]
            log_z[zp] = np.logaddexp(log_z[zp] - decay, np.log(keep * deliveries[zp] / d))
    return log_x, log_z, expected_delivery


def build_view(live: list[Request], queue: ExecutionQueue, policy: PolicyConfig, coeff: PriceCoefficients,
               decode_costs: list[tuple[int, float]], resources: ResourcePool, start_ns: int,
               max_context: int, max_lanes: int, speculation=None) -> PlanningView:
    """`speculation` is (SpeculationModel, ProposalSource) when speculative programs are loaded."""
    log_x, log_z, expected_delivery = project_rates(live, queue, policy.adaptation_ms)
    lp, lo, ld = log_prices(log_x, log_z, coeff)
    phases = [r.phase for r in live]
    active = [i for i, p in enumerate(phases) if p is Phase.DECODE]
    dec = [i for i in active if live[i].output_left > 0 and live[i].context_tokens < max_context]
    pre = [i for i, p in enumerate(phases) if p is Phase.PREFILL and live[i].queued_prompt == 0
           and live[i].prompt_left > 0]
    if len(dec) > max_lanes:  # the 64-slot bound: keep the highest-priced streams
        dec = sorted(dec, key=lambda i: (-lo[i], live[i].handle))[:max_lanes]
    if len(pre) > max_lanes:
        pre = sorted(pre, key=lambda i: (live[i].slot is None, -lp[i], live[i].handle))[:max_lanes]

    scale = shared_log_scale(lo[dec], ld[dec], lp[pre], lo[pre])
    s = math.exp(-scale)
    c = policy.decode_age_price
    sigma = reference_interval_ms(decode_costs, len(active), len(active))
    c_sigma = c * sigma * s if sigma is not None else 0.0

    d = np.asarray(dec, dtype=np.int64)
    ages = np.array([_age_ms(live[i], expected_delivery[i], start_ns) for i in dec], dtype=float)
    with np.errstate(over="ignore"):
        base = np.exp(lo[d] - scale) + np.exp(ld[d] - scale) + c_sigma * ages
    decode = LanePool(_handles(live, dec), _lru(live, dec), _slots(live, dec), base, age_slope=c_sigma)
    if speculation is not None:
        _add_speculation(decode, [live[i] for i in dec], np.exp(lo[d] - scale), speculation, policy, max_context)

    prefill: dict[GraphKind, tuple[LanePool, list[Request]]] = {}
    for kind in (GraphKind.PREFILL, GraphKind.SCORED_PREFILL):
        idx = [i for i in pre if (kind is GraphKind.SCORED_PREFILL) == live[i].spec.score_prompt]
        if not idx:
            continue
        p = np.asarray(idx, dtype=np.int64)
        reqs = [live[i] for i in idx]
        pool = LanePool(
            _handles(live, idx), _lru(live, idx), _slots(live, idx), np.zeros(len(idx)),
            log_prefill=lp[p] - scale,
            first_token=np.exp(lo[p] - scale),
            prompt_left=np.array([r.prompt_left for r in reqs], dtype=np.int64),
            to_endpoint=np.array([r.next_endpoint() - r.prompt_done for r in reqs], dtype=np.int64),
            resident=np.array([r.slot is not None for r in reqs]),
            pages=np.array([resources.extent_pages(r.spec) for r in reqs], dtype=np.int64),
        )
        prefill[kind] = (pool, reqs)
    return PlanningView(scale, c * s * len(active), sigma, decode, [live[i] for i in dec], prefill)


def _add_speculation(pool: LanePool, reqs: list[Request], extra_value, speculation, policy, max_context):
    model, source = speculation
    pool.extra_value = extra_value
    pool.survival = np.array([model.survival(r.speculation, source) for r in reqs]).reshape(len(reqs), model.depth)
    pool.survival_alpha = pool.survival ** policy.adaptive_verification_alpha
    forecast = np.array([model.forecast(r.speculation) for r in reqs]).reshape(len(reqs), model.depth)
    # The device admits causal frontiers; a nonincreasing envelope keeps the prediction causal.
    pool.forecast = np.minimum.accumulate(forecast, axis=1)
    pool.limit = np.array([min(r.output_left, max_context - r.context_tokens) for r in reqs], dtype=np.int64)


def _age_ms(r: Request, expected_delivery_ns: int | None, start_ns: int) -> float:
    # A queued expected delivery restarts the projected age at its expected time.
    ref = expected_delivery_ns if expected_delivery_ns is not None else r.last_publication_ns
    return 0.0 if ref is None else max(0, start_ns - ref) / 1e6


def _handles(live, idx):
    return np.array([live[i].handle for i in idx], dtype=np.int64)


def _lru(live, idx):
    return np.array([live[i].last_served_seq for i in idx], dtype=np.int64)


def _slots(live, idx):
    return np.array([NO_SLOT if live[i].slot is None else live[i].slot for i in idx], dtype=np.int64)

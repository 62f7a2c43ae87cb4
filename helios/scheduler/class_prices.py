"""How a service class and a tenant map onto the utility's prices (docs/scheduling-utility.md,
section 13, "Service classes and tenants"). Pure functions; nothing here reads a clock or the table.

A class changes a request's prices, not its queue:

- its first-token target D sets the adaptation time of the request's prompt phase,
  tau_wait = D / WAIT_ADAPTATIONS, so a waiting prompt's price grows as e^(W / tau_wait) = e^(K W / D):
  requests of every class that have waited the same fraction of their own target have the same price
  growth (a deadline-normalized price);
- its gap target G sets the stream phase's, tau_stream = G / GAP_ADAPTATIONS, so the price a stall of T
  ms owes a decoder, (f/x + g/z)(e^(T/tau_stream) - 1), is large exactly when T breaks that decoder's own
  gap target, and the age cost c (value/ms^2) becomes c (tau / tau_stream)^2, the same cost in the
  class's time;
- a deadline-only class (batch) spends half its deadline E on the first token and spreads the other half
  over its output: D = E/2, G = E / (2 * max_output_tokens);
- a first-token target (stated, or implied by a deadline) makes the prompt phase count only output as
  service: a chunk delivers nothing the target measures, so it does not lower the price;
- its weight, times its tenant's share, multiplies f and g: the log-utility weight of the request.

The scheduler carries these per request as RequestTable columns (log_w, tau_ms, output_only), starts a
mean-law window at tau_wait, and shares a named tenant's weight among its live classed requests
(tenant_share.py); the age cost is computed here but not yet applied by the scheduler.

Tenants: the tenant's weight W is shared by its n live requests, w_i = class weight * W / n. Then the
sum over one tenant's requests of w_i log x_i, with equal rates x_i = X/n, is W log X - W log n: at a given
request count, the tenant-level proportional fairness sum_tenants W log X_tenant, and a tenant gains
nothing by splitting its work into more requests (VTC's setting).

The constants are the measured balance point of today's single-class policy: the balanced preset's
tau = 50 ms was chosen (section 5) against the simulator's SLOs of TTFT 1,546 ms and gap 379 ms, i.e.
about 30 adaptation times per first-token target and 7.5 per gap target. The default class (no
targets, weight one, its own tenant alone) maps to exactly today's coefficients.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from helios.config import PolicyConfig
from helios.scheduler.service_class import ServiceClass

WAIT_ADAPTATIONS = 30.0  # first-token target / tau_wait  (1,546 ms / 50 ms on the calibrated engine)
GAP_ADAPTATIONS = 7.5  # gap target / tau_stream          (379 ms / 50 ms)


@dataclass(frozen=True, slots=True)
class ClassPrices:
    """One request's price coefficients: `weight` multiplies f and g, `wait_tau_ms` and `stream_tau_ms`
    are its prompt-phase and stream-phase adaptation times, `decode_age_price` its age cost c.
    `gap_target_ms`: the gap target the class states (not one a deadline implies), which only the
    off-by-default `StudyConfig.class_gap_bound` reads.
    `output_only`: its prompt phase counts only output as service (a first-token target: a prompt
    chunk delivers nothing the target measures, so it does not lower the price)."""

    weight: float
    wait_tau_ms: float
    stream_tau_ms: float
    decode_age_price: float
    output_only: bool = False
    gap_target_ms: float | None = None  # the class's stated gap target (StudyConfig.class_gap_bound)


def class_targets(cls: ServiceClass, prompt_tokens: int, max_output_tokens: int) -> tuple[float | None, float | None]:
    """(first-token target, gap target) in ms for one request; a deadline fills what the class leaves
    unstated (half for the first token, half spread over the output). None: no target."""
    first, gap = cls.first_token_target_ms(prompt_tokens), cls.gap_ms
    if cls.deadline_ms is not None:
        first = cls.deadline_ms / 2 if first is None else first
        gap = cls.deadline_ms / (2 * max_output_tokens) if gap is None else gap
    return first, gap


def request_weight(cls: ServiceClass, tenant_weight: float = 1.0, tenant_requests: int = 1) -> float:
    """The log-utility weight of one request: class weight x its tenant's weight shared by the tenant's
    `tenant_requests` live requests."""
    if tenant_requests < 1:
        raise ValueError(f"a tenant with a live request has at least one, got {tenant_requests}")
    return cls.weight * tenant_weight / tenant_requests


def class_prices(cls: ServiceClass, policy: PolicyConfig, prompt_tokens: int, max_output_tokens: int,
                 tenant_weight: float = 1.0, tenant_requests: int = 1) -> ClassPrices:
    """The coefficients of one request of class `cls` (see the module docstring). An unstated target
    keeps the policy's adaptation time, so the default class gets exactly today's coefficients."""
    tau = policy.adaptation_ms
    first, gap = class_targets(cls, prompt_tokens, max_output_tokens)
    wait_tau = tau if first is None else first / WAIT_ADAPTATIONS
    stream_tau = tau if gap is None else gap / GAP_ADAPTATIONS
    dilation = stream_tau / tau  # the class's time unit in the policy's
    weight = request_weight(cls, tenant_weight, tenant_requests)
    return ClassPrices(weight, wait_tau, stream_tau, weight * policy.decode_age_price / (dilation * dilation),
                       first is not None, cls.gap_ms)


def waiting_log_price(log_f: float, log_x: float, prices: ClassPrices, wait_ms: float,
                      mean_law: bool = False) -> float:
    """log of the fairness price w f / x of a prompt that has waited `wait_ms` unserved from rate x. On
    the EWMA law its rate is x e^(-W / tau_wait), so the price is w f / x * e^(W / tau_wait); on the mean
    law (PromptRateLaw, one tau of prior) x tau / (tau + W), so w f / x * (tau + W) / tau. Both grow
    without bound for any positive weight."""
    base = log_f + math.log(prices.weight) - log_x
    tau = prices.wait_tau_ms
    return base + (math.log1p(wait_ms / tau) if mean_law else wait_ms / tau)


def stall_log_growth(stall_ms: float, prices: ClassPrices) -> float:
    """log of e^(T / tau_stream) - 1: the growth factor of a decoder's prices over a stall of T ms
    (section 4's G_i(T) = (f/x + g/z)(e^(T/tau) - 1), in the class's time); -inf for no stall."""
    if stall_ms <= 0:
        return -math.inf
    return math.log(math.expm1(stall_ms / prices.stream_tau_ms))

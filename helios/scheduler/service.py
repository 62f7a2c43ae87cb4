"""Service prices from exponentially weighted service rates, kept in the log domain.

See docs/scheduling-utility.md. A request's utility is
    prompt + beta * output + f * log x + g * log z
so its gradient prices are 1 + f/x per prompt token, beta + f/x per output token and g/z
per delivery. x and z are EWMA service rates with time constant tau = adaptation_ms.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from helios.config import PolicyConfig

NEG_INF = float("-inf")


def _log(value: float) -> float:
    return math.log(value) if value > 0 else NEG_INF


@dataclass(slots=True)
class ServiceHistory:
    """Physical service rates of one request: tokens/ms and deliveries/ms, as logs."""

    log_x: float
    log_z: float | None = None  # None until the first published burst


def logaddexp(a: float, b: float) -> float:
    """Scalar log(e^a + e^b) in plain floats (numpy's scalar call costs more than the math)."""
    hi, lo = (a, b) if a >= b else (b, a)
    return hi + math.log1p(math.exp(lo - hi)) if lo > -math.inf else hi


def ewma_log(log_rate: float, delta_ms: float, served: float, tau_ms: float) -> float:
    """log of  e^(-d/tau) * r + (1 - e^(-d/tau)) * served/d.

    An unserved interval multiplies the rate by e^(-d/tau), so its price grows by e^(d/tau);
    the logaddexp form is exact and cannot overflow however long the request waits.
    """
    decayed = log_rate - delta_ms / tau_ms
    if served <= 0:
        return decayed
    fresh = math.log(-math.expm1(-delta_ms / tau_ms)) + math.log(served / delta_ms)
    return logaddexp(decayed, fresh)


@dataclass(frozen=True, slots=True)
class PriceCoefficients:
    """log f, log g and log beta, precomputed once per policy (log 0 = -inf)."""

    log_f: float
    log_g: float
    log_beta: float

    @staticmethod
    def of(policy: PolicyConfig) -> "PriceCoefficients":
        return PriceCoefficients(
            _log(policy.token_fairness), _log(policy.delivery_fairness), _log(policy.output_token_value)
        )


def log_prices(log_x: np.ndarray, log_z: np.ndarray, k: PriceCoefficients):
    """Vectorized log prices: prefill token, output token, delivery.

    Requests without a delivery history carry NaN in log_z and get a zero delivery price.
    """
    with np.errstate(invalid="ignore"):
        fair = k.log_f - log_x  # log(f/x)
        prefill = np.logaddexp(0.0, fair)  # log(1 + f/x)
        output = np.logaddexp(k.log_beta, fair)  # log(beta + f/x)
        delivery = np.where(np.isnan(log_z), NEG_INF, k.log_g - log_z)  # log(g/z)
    return prefill, output, delivery

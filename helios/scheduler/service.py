"""Service prices from exponentially weighted service rates, kept in the log domain.

See docs/scheduling-utility.md. A request's utility is
    prompt + beta * output + f * log x + g * log z
so its gradient prices are 1 + f/x per prompt token, beta + f/x per output token and g/z
per delivery. x and z are EWMA service rates with time constant tau = adaptation_ms.

x counts normalized service: an output token counts one, a prompt token r_d/r_p of one, the
ratio of the phases' measured reference rates (`Normalizers`), so x measures machine time, not
raw tokens. x is stored in physical output tokens/ms: a phase transition or a new measurement
leaves it, and so every price, where it was until actual service moves it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from helios.config import PolicyConfig
from helios.scheduler.utility import count_nonzero

NEG_INF = float("-inf")


def _log(value: float) -> float:
    return math.log(value) if value > 0 else NEG_INF


def _decay_terms(delta_ms, tau_ms, memo: dict | None):
    """(d/tau, log((1 - e^(-d/tau)) / d)), on scalars or arrays; scalar ones kept in `memo`
    (Memo.decay) when given: the same numpy expressions, so the same values."""
    # Per-request adaptation times (class prices) come as an array: those are computed, not kept.
    scalar = memo is not None and isinstance(delta_ms, float) and isinstance(tau_ms, float)
    if scalar and (hit := memo.get((delta_ms, tau_ms))) is not None:
        return hit
    decay = np.divide(delta_ms, tau_ms)
    terms = decay, np.log(-np.expm1(-decay) / delta_ms)  # log((1 - e^(-d/tau)) / d)
    if scalar:
        if len(memo) >= 1024:
            memo.clear()
        memo[(delta_ms, tau_ms)] = terms
    return terms


def ewma_log(log_rate, delta_ms: float, served, tau_ms, memo: dict | None = None):
    """log of  e^(-d/tau) * r + (1 - e^(-d/tau)) * served/d,  on scalars or arrays; `tau_ms` is the
    policy's scalar or, with class prices, each rate's own adaptation time (RequestTable.taus).

    The one EWMA of the scheduler: planning's projection, interval accounting and publication
    all use it. An unserved interval (served = 0) multiplies the rate by e^(-d/tau) exactly,
    so its price grows by e^(d/tau); the logaddexp form cannot overflow however long the
    request waits. A NaN rate (no history) stays NaN. `memo`: the scheduler's Memo.decay.
    """
    decay, log_keep = _decay_terms(delta_ms, tau_ms, memo)
    if type(served) is float and served == 1.0:  # one delivery each (a publication): log 1 = 0
        return np.logaddexp(np.subtract(log_rate, decay), log_keep)
    served = np.asarray(served, dtype=float)
    positive = served > 0
    if count_nonzero(positive) == positive.size:  # all served: no log 0 to mask (a masked log is slow)
        log_served = np.log(served)
    else:
        log_served = np.full(served.shape, NEG_INF)  # log 0, without a divide-by-zero warning
        np.log(served, out=log_served, where=positive)
    return np.logaddexp(np.subtract(log_rate, decay), log_keep + log_served)


def mean_rate_log(log_rate, window_ms, delta_ms: float, served):
    """log of  (r * w + served) / (w + d),  on arrays: a mean rate over a window of w ms, extended
    by an interval of d ms in which `served` units were received.

    The law before a request has history (`StudyConfig.prompt_rate_law`): its starting rate counts as
    one adaptation time (w = tau) and it averages everything since. Unserved, its rate falls as
    w / (w + d), so its price grows linearly with the wait, without bound. NaN stays NaN.
    """
    served = np.asarray(served, dtype=float)
    with np.errstate(divide="ignore"):  # log 0 = -inf: an unserved interval adds nothing
        log_served = np.log(served)
    window_ms = np.asarray(window_ms, dtype=float)
    return np.logaddexp(log_rate + np.log(window_ms), log_served) - np.log(window_ms + delta_ms)


def first_token_progress(prompt_tokens, prompt_lengths, outputs, prompt_credit: bool = True):
    """Service on the mean-rate law: progress toward the first output token. A prompt of P tokens is
    worth one output token, so each of its tokens counts 1/P; output tokens count one each. Without
    `prompt_credit` (PromptRateLaw.FIRST_OUTPUT) only output counts: a chunk delivers nothing."""
    if not prompt_credit:
        return np.asarray(outputs, dtype=float) + np.zeros(np.shape(prompt_tokens))
    return np.asarray(prompt_tokens, dtype=float) / prompt_lengths + outputs


@dataclass(frozen=True, slots=True)
class PriceCoefficients:
    """log f, log g and log beta, precomputed once per policy (log 0 = -inf)."""

    log_f: float
    log_g: float
    log_beta: float

    def time_scaled(self, log_decode: float) -> "PriceCoefficients":
        """f and g scaled by one factor, at most 1, so that f/x <= beta at x = r_d (the measured
        reference decode rate, exp(log_decode) tokens/ms): f' = min(f, beta r_d). A zero f or
        beta leaves the coefficients as they are (zero removes a preference; it is not a scale)."""
        shift = self.log_beta + log_decode - self.log_f
        if not math.isfinite(shift) or shift >= 0.0:
            return self
        return PriceCoefficients(self.log_f + shift, self.log_g + shift, self.log_beta)

    @staticmethod
    def of(policy: PolicyConfig) -> "PriceCoefficients":
        return PriceCoefficients(
            _log(policy.token_fairness), _log(policy.delivery_fairness), _log(policy.output_token_value)
        )


@dataclass(frozen=True, slots=True)
class Normalizers:
    """log of the reference token rates (tokens/ms) of the two phases, from the measured catalog.

    prefill: the fastest measured per-row prompt rate, max C/T over prefill graphs; decode: the
    fastest measured per-stream output rate, max 1/T over delivery-bearing graphs (one committed
    token per row is the only output a round guarantees). An unmeasured phase has reference 1
    (log 0). `PHYSICAL` (both 1) counts a prompt token as an output token: the ablation without
    normalization, and what happens before anything is measured.
    """

    log_prefill: float = 0.0
    log_decode: float = 0.0

    def normalized_service(self, prompt_tokens, output_tokens):
        """Service in output-token units: o + p * r_d / r_p. A prompt token takes 1/r_p ms of the
        machine and an output token 1/r_d, so this is machine time at the decode reference rate:
        x stays in physical output tokens/ms, and prices stay in physical units."""
        return (np.asarray(prompt_tokens, dtype=float) * math.exp(self.log_decode - self.log_prefill)
                + np.asarray(output_tokens, dtype=float))


PHYSICAL = Normalizers()


def reference_normalizers(prefill_costs, decode_costs) -> Normalizers:
    """`prefill_costs`: (token_capacity, t_ms) of measured prefill graphs; `decode_costs`:
    (batch, t_ms) of measured delivery-bearing graphs. Unmeasured phases keep reference 1."""
    lp = max((math.log(c / t) for c, t in prefill_costs if t > 0), default=0.0)
    ld = max((-math.log(t) for _, t in decode_costs if t > 0), default=0.0)
    return Normalizers(lp, ld)


def log_prices(log_x: np.ndarray, log_z: np.ndarray, k: PriceCoefficients, norm: Normalizers = PHYSICAL,
               gradient_prompt: bool = False, with_prompt: bool = True, log_w: np.ndarray | None = None):
    """Vectorized log prices: prefill token, output token, delivery, and the fairness part f/x
    (what grows while a request waits).

    x counts normalized service (output tokens, plus prompt tokens at r_d / r_p), so the spec's
    prices apply as written: 1 + f/x per prompt token, beta + f/x per output token, g/z per
    delivery. With `gradient_prompt`, a prompt token costs its exact gradient 1 + f/x * r_d/r_p
    instead (an ablation). Requests without a delivery history carry NaN in log_z and get a zero
    delivery price. `log_w`: each request's log-utility weight (class_prices.py), which multiplies
    f and g; None is weight one for every request.
    """
    fair = k.log_f - log_x  # log(f/x); rates are finite, so no inf - inf
    log_z = log_z if log_w is None else log_z - log_w  # g/(z/w) = w g/z
    if log_w is not None:
        fair += log_w  # w f/x
    prefill = None  # without `with_prompt` the caller serves no prompt and skips its price
    if with_prompt:
        prompt_fair = fair + (norm.log_decode - norm.log_prefill) if gradient_prompt else fair
        prefill = np.logaddexp(0.0, prompt_fair)  # log(1 + f/x)
    output = np.logaddexp(k.log_beta, fair)  # log(beta + f/x)
    delivery = k.log_g - log_z  # log(g/z); NaN where there is no delivery history yet
    missing = np.isnan(log_z)
    if count_nonzero(missing):  # skipped in the steady state, where every request has published
        delivery[missing] = NEG_INF
    return prefill, output, delivery, fair

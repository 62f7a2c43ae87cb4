"""Acceptance and confidence estimates (spec: "Completed confidence and acceptance").

Each request keeps, per proposal source, prefix-survival estimates s_d (the probability that
the first d proposals all survive verification) and a confidence forecast (the average of its
completed joint-prefix probabilities). Both start from a population prior, begin with weight 2,
cap their weight at 128, and age with a half-life of 128 generated tokens. Unobserved suffixes
keep their means.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum

import numpy as np

START_WEIGHT = 2.0
WEIGHT_CAP = 128.0
HALF_LIFE_TOKENS = 128.0
PRIOR_STEP = 1.0 / 64.0
CONFIDENCE_Z = math.log(20.0)  # optimistic bound: mean + sqrt(ln 20 / (2 w))


class ProposalSource(Enum):
    LEARNED = "learned"  # a draft model or MTP head: D counts produced positions
    COPY = "copy"  # prompt lookup: D bounds the supplied prefix; no learned draws


class PopulationPrior:
    """Starts at 0.5^d for the d-th draft position; moves toward each completed value by 1/64."""

    def __init__(self, depth: int):
        self.means = 0.5 ** np.arange(1, depth + 1, dtype=float)

    def observe(self, depths: np.ndarray, values: np.ndarray) -> None:
        self.means[depths] += PRIOR_STEP * (values - self.means[depths])

    def seed(self, survival) -> None:
        s = np.asarray(survival, dtype=float)[: len(self.means)]
        self.means[: len(s)] = s


@dataclass(slots=True)
class PrefixEstimate:
    means: np.ndarray
    weights: np.ndarray
    generated_at_update: int = 0

    @staticmethod
    def from_prior(prior: PopulationPrior, generated: int = 0) -> "PrefixEstimate":
        return PrefixEstimate(prior.means.copy(), np.full(len(prior.means), START_WEIGHT), generated)

    def age(self, generated: int) -> None:
        # Weights halve every 128 generated tokens, so old behaviour fades.
        elapsed = generated - self.generated_at_update
        if elapsed > 0:
            self.weights *= 0.5 ** (elapsed / HALF_LIFE_TOKENS)
            self.generated_at_update = generated

    def observe(self, depths: np.ndarray, values: np.ndarray) -> None:
        """depths are 0-based positions (d-1); values in [0, 1]."""
        w = self.weights[depths]
        self.means[depths] = (w * self.means[depths] + values) / (w + 1.0)
        self.weights[depths] = np.minimum(w + 1.0, WEIGHT_CAP)

    def optimistic(self) -> np.ndarray:
        """Funded acceptance learning's bound: min(1, mean + sqrt(ln 20 / (2 * aged weight)))."""
        return np.minimum(1.0, self.means + np.sqrt(CONFIDENCE_Z / (2.0 * self.weights)))


@dataclass(slots=True)
class SpeculationState:
    """One request's acceptance (per source) and confidence forecast."""

    acceptance: dict = field(default_factory=dict)  # ProposalSource -> PrefixEstimate
    forecast: PrefixEstimate | None = None


class SpeculationModel:
    """Population priors plus the per-request update rules."""

    def __init__(self, depth: int):
        self.depth = depth
        self.acceptance_prior = {s: PopulationPrior(depth) for s in ProposalSource}
        self.forecast_prior = PopulationPrior(depth)

    def state(self, st: SpeculationState, source: ProposalSource, generated: int) -> PrefixEstimate:
        est = st.acceptance.get(source)
        if est is None:
            est = st.acceptance[source] = PrefixEstimate.from_prior(self.acceptance_prior[source], generated)
        return est

    def survival(self, st: SpeculationState, source: ProposalSource) -> np.ndarray:
        est = st.acceptance.get(source)
        return (est.means if est is not None else self.acceptance_prior[source].means)

    def forecast(self, st: SpeculationState) -> np.ndarray:
        return st.forecast.means if st.forecast is not None else self.forecast_prior.means

    def observe_round(self, st: SpeculationState, source: ProposalSource, generated: int, accepted: int,
                      offered: int, censored: bool, survival: np.ndarray | None = None) -> None:
        """Accepted prefixes are positive; a rejection is zero for every longer offered prefix;
        termination censors the remaining suffix. Survival rows replace binary observations."""
        if offered <= 0:
            return  # width-one rounds measure cost, not acceptance
        last = accepted if censored else offered
        depths = np.arange(last)
        values = (depths < accepted).astype(float)
        if survival is not None:
            n = min(len(survival), last)
            values[:n] = survival[:n]
        est = self.state(st, source, generated)
        est.age(generated)
        est.observe(depths, values)
        self.acceptance_prior[source].observe(depths, values)

    def observe_confidence(self, st: SpeculationState, generated: int, joint: np.ndarray) -> None:
        if not len(joint):
            return
        if st.forecast is None:
            st.forecast = PrefixEstimate.from_prior(self.forecast_prior, generated)
        depths = np.arange(len(joint))
        st.forecast.age(generated)
        st.forecast.observe(depths, joint)
        self.forecast_prior.observe(depths, joint)


def expected_output(survival: np.ndarray, rows: int, alpha: float = 1.0) -> float:
    """1 + sum(s_1..s_(rows-1)) with each s raised to alpha; rows include the pending token."""
    if rows <= 1:
        return 1.0
    s = survival[: rows - 1]
    return 1.0 + float(np.sum(s ** alpha if alpha != 1.0 else s))

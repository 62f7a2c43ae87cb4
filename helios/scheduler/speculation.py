"""Acceptance and confidence estimates (spec: "Completed confidence and acceptance").

Each request keeps, per proposal source, prefix-survival estimates s_d (the probability that
the first d proposals all survive verification) and a confidence forecast (the average of its
completed joint-prefix probabilities). Both start from a population prior, begin with weight 2,
cap their weight at 128, and age with a half-life of 128 generated tokens. Unobserved suffixes
keep their means.
"""

from __future__ import annotations

import math
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


class PrefixColumns:
    """Prefix estimates of many requests as [rows, depth] matrices (0-based draft positions):
    means, weights, the generated count at the last update, and whether a row has its own
    estimate yet (until then the population prior stands in for it)."""

    def __init__(self, depth: int, capacity: int = 0):
        self.depth = depth
        self.means = np.zeros((capacity, depth))
        self.weights = np.zeros((capacity, depth))
        self.generated = np.zeros(capacity, dtype=np.int64)
        self.has = np.zeros(capacity, dtype=bool)

    def grow(self, capacity: int) -> None:
        old = len(self.has)
        for name in ("means", "weights", "generated", "has"):
            col = getattr(self, name)
            new = np.zeros((capacity,) + col.shape[1:], dtype=col.dtype)
            new[:old] = col
            setattr(self, name, new)

    def start(self, row: int, prior: PopulationPrior, generated: int) -> None:
        self.means[row] = prior.means
        self.weights[row] = START_WEIGHT
        self.generated[row] = generated
        self.has[row] = True

    def current(self, rows: np.ndarray, prior: PopulationPrior) -> np.ndarray:
        """Each row's means, or the prior's for rows without an estimate: [len(rows), depth]."""
        return np.where(self.has[rows, None], self.means[rows], prior.means)

    def age(self, row: int, generated: int) -> None:
        # Weights halve every 128 generated tokens, so old behaviour fades.
        elapsed = generated - int(self.generated[row])
        if elapsed > 0:
            self.weights[row] *= 0.5 ** (elapsed / HALF_LIFE_TOKENS)
            self.generated[row] = generated

    def observe(self, row: int, depths: np.ndarray, values: np.ndarray) -> None:
        """depths are 0-based positions (d-1); values in [0, 1]."""
        w = self.weights[row, depths]
        self.means[row, depths] = (w * self.means[row, depths] + values) / (w + 1.0)
        self.weights[row, depths] = np.minimum(w + 1.0, WEIGHT_CAP)

    def optimistic(self, row: int) -> np.ndarray:
        """Funded acceptance learning's bound: min(1, mean + sqrt(ln 20 / (2 * aged weight)))."""
        return np.minimum(1.0, self.means[row] + np.sqrt(CONFIDENCE_Z / (2.0 * self.weights[row])))

    def aged_weights(self, rows: np.ndarray, generated: np.ndarray) -> np.ndarray:
        """Weights aged to each row's current generated count, without storing the aging;
        rows without their own estimate stand at the starting weight: [len(rows), depth]."""
        elapsed = np.maximum(generated - self.generated[rows], 0)
        aged = self.weights[rows] * (0.5 ** (elapsed / HALF_LIFE_TOKENS))[:, None]
        return np.where(self.has[rows, None], aged, START_WEIGHT)

    def optimistic_rows(self, rows: np.ndarray, prior: PopulationPrior, generated: np.ndarray) -> np.ndarray:
        """`optimistic` for many rows at their aged weights (the prior stands in for rows without one)."""
        bonus = np.sqrt(CONFIDENCE_Z / (2.0 * self.aged_weights(rows, generated)))
        return np.minimum(1.0, self.current(rows, prior) + bonus)


class SpeculationColumns:
    """Every request row's acceptance (per proposal source) and confidence forecast."""

    def __init__(self, depth: int, capacity: int = 0):
        self.acceptance = {s: PrefixColumns(depth, capacity) for s in ProposalSource}
        self.forecast = PrefixColumns(depth, capacity)

    def _all(self) -> list[PrefixColumns]:
        return [*self.acceptance.values(), self.forecast]

    def grow(self, capacity: int) -> None:
        for cols in self._all():
            cols.grow(capacity)

    def clear(self, row: int) -> None:
        for cols in self._all():
            cols.has[row] = False


class SpeculationModel:
    """Population priors plus the per-request update rules, on `SpeculationColumns` rows."""

    def __init__(self, depth: int):
        self.depth = depth
        self.acceptance_prior = {s: PopulationPrior(depth) for s in ProposalSource}
        self.forecast_prior = PopulationPrior(depth)

    def survival(self, cols: SpeculationColumns, rows: np.ndarray, source: ProposalSource) -> np.ndarray:
        return cols.acceptance[source].current(rows, self.acceptance_prior[source])

    def forecast(self, cols: SpeculationColumns, rows: np.ndarray) -> np.ndarray:
        return cols.forecast.current(rows, self.forecast_prior)

    def observe_round(self, cols: SpeculationColumns, row: int, source: ProposalSource, generated: int,
                      accepted: int, offered: int, censored: bool, survival: np.ndarray | None = None) -> None:
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
        est = cols.acceptance[source]
        if not est.has[row]:
            est.start(row, self.acceptance_prior[source], generated)
        est.age(row, generated)
        est.observe(row, depths, values)
        self.acceptance_prior[source].observe(depths, values)

    def observe_confidence(self, cols: SpeculationColumns, row: int, generated: int, joint: np.ndarray) -> None:
        if not len(joint):
            return
        est = cols.forecast
        if not est.has[row]:
            est.start(row, self.forecast_prior, generated)
        depths = np.arange(len(joint))
        est.age(row, generated)
        est.observe(row, depths, joint)
        self.forecast_prior.observe(depths, joint)


def expected_output(survival: np.ndarray, rows: int, alpha: float = 1.0) -> float:
    """1 + sum(s_1..s_(rows-1)) with each s raised to alpha; rows include the pending token."""
    if rows <= 1:
        return 1.0
    s = survival[: rows - 1]
    return 1.0 + float(np.sum(s ** alpha if alpha != 1.0 else s))

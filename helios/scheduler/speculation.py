"""Acceptance and confidence estimates (spec: "Completed confidence and acceptance").

Each request keeps, per proposal source, prefix-survival estimates s_d (the probability that
the first d proposals all survive verification) and a confidence forecast (the average of its
completed joint-prefix probabilities). Both start from a population prior, begin with weight 2,
cap their weight at 128, and age with a half-life of 128 generated tokens. Unobserved suffixes
keep their means.

Spec deviation (AcceptanceEstimate.CONDITIONAL, the default; docs/speculation.md): the acceptance
survival a request is scheduled with is instead the product of per-position conditional
acceptances c_d = P(position d survives | position d-1 survived). Each c_d is the weighted mean of
its own evidence (survived / reached, aged and capped like the means) and a starting value worth
START_WEIGHT observations: the request's pooled per-position rate (whose own prior is the
population curve's pooled rate). A request with nothing observed uses the population prior
itself (0.5^d untrained); once it has shown rate q at depths 1-3, depths 4-7 start at q per
position instead of at 0.5^d, and a rejection at depth 1 is no longer evidence against depth 5.
The spec's per-depth means and weights are still kept: the weights give the optimistic bound's
confidence, and AcceptanceEstimate.SPEC schedules with the means.
"""

from __future__ import annotations

import math
from enum import Enum
from itertools import compress

import numpy as np

from helios.config import AcceptanceEstimate

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

    def observe_prefixes(self, values: np.ndarray, lengths: np.ndarray, starting: np.ndarray) -> np.ndarray:
        """Row i's values[i, :lengths[i]], one row after another (the prior is a running mean, so
        order matters). Returns the means as they stood before each `starting` row: a request's
        estimate starts from the prior its own observation has not moved yet."""
        # Python floats, one step per observation: the same IEEE arithmetic as `observe`, row by
        # row, at a few hundred steps per round (cheaper than a numpy call per row).
        means = self.means.tolist()
        starts = []
        for row, n, start in zip(values.tolist(), lengths.tolist(), starting.tolist()):
            if start:
                starts.append(list(means))
            for d in range(n):
                means[d] += PRIOR_STEP * (row[d] - means[d])
        self.means[:] = means
        return np.asarray(starts, dtype=float).reshape(-1, len(means))

    def seed(self, survival) -> None:
        s = np.asarray(survival, dtype=float)[: len(self.means)]
        self.means[: len(s)] = s


def conditional_survival(hits: np.ndarray, tries: np.ndarray, prior: np.ndarray) -> np.ndarray:
    """Prefix survival [n, depth] as the product of per-position conditionals (the
    CONDITIONAL estimate). hits[:, d] and tries[:, d] are the (aged) evidence that position d
    survived and that it was reached; `prior` is the population prefix survival [depth].

    Every position starts, with START_WEIGHT, at the row's pooled per-position rate
    q = (sum hits + 2 q_pop) / (sum tries + 2), where q_pop = sum p_d / sum p_(d-1) is the
    population curve's own pooled rate (0.5 for the untrained 0.5^d): a request that accepts at q
    where it has been seen assumes q per position where it has not. The population curve's shape
    is not used: its unreached depths keep their starting means (the spec's rule), so a partly
    trained curve (0.85, 0.72, 0.61, then 0.0625) would make depth 4 look like a cliff."""
    prev = np.concatenate(([1.0], prior[:-1]))
    q_pop = float(np.clip(prior, 0.0, 1.0).sum() / np.clip(prev, 0.0, 1.0).sum())  # prev[0] = 1: positive
    q = (hits.sum(axis=1) + START_WEIGHT * q_pop) / (tries.sum(axis=1) + START_WEIGHT)
    cond = (hits + START_WEIGHT * q[:, None]) / (tries + START_WEIGHT)
    return np.cumprod(np.clip(cond, 0.0, 1.0), axis=1)


class PrefixColumns:
    """Prefix estimates of many requests as [rows, depth] matrices (0-based draft positions):
    means, weights, the generated count at the last update, and whether a row has its own
    estimate yet (until then the population prior stands in for it). Alongside the means, the
    conditional evidence: hits (position d survived) and tries (position d was reached)."""

    def __init__(self, depth: int, capacity: int = 0):
        self.depth = depth
        self.means = np.zeros((capacity, depth))
        self.weights = np.zeros((capacity, depth))
        self.hits = np.zeros((capacity, depth))
        self.tries = np.zeros((capacity, depth))
        self.generated = np.zeros(capacity, dtype=np.int64)
        self.has = np.zeros(capacity, dtype=bool)
        self._prefixes = np.tri(depth + 1, depth, -1, dtype=bool)  # row L: True at positions < L

    def grow(self, capacity: int) -> None:
        old = len(self.has)
        for name in ("means", "weights", "hits", "tries", "generated", "has"):
            col = getattr(self, name)
            new = np.zeros((capacity,) + col.shape[1:], dtype=col.dtype)
            new[:old] = col
            setattr(self, name, new)

    def start(self, rows: np.ndarray, means: np.ndarray, generated: np.ndarray) -> None:
        """Rows' own estimates from the prior's `means` (one row of means per row, or one for all)."""
        self.means[rows] = means
        self.weights[rows] = START_WEIGHT
        self.hits[rows] = 0.0
        self.tries[rows] = 0.0
        self.generated[rows] = generated
        self.has[rows] = True

    def current(self, rows: np.ndarray, prior: PopulationPrior) -> np.ndarray:
        """Each row's means, or the prior's for rows without an estimate: [len(rows), depth]."""
        return np.where(self.has[rows, None], self.means[rows], prior.means)

    def conditional(self, rows: np.ndarray, prior: PopulationPrior) -> np.ndarray:
        """Each row's `conditional_survival`, or the prior's for rows without an estimate (a row
        starts with its first observation, so a started row always has evidence)."""
        own = conditional_survival(self.hits[rows], self.tries[rows], prior.means)
        return np.where(self.has[rows, None], own, prior.means)

    def age(self, rows: np.ndarray, generated: np.ndarray) -> None:
        # Weights halve every 128 generated tokens, so old behaviour fades.
        elapsed = generated - self.generated[rows]
        on = elapsed > 0
        if not on.any():
            return
        rows, generated = rows[on], generated[on]
        # Python's float power, as one row's aging computes it (numpy's vector power may differ in
        # the last bit, and a round must age its rows exactly as one request at a time would).
        decay = np.array([0.5 ** (e / HALF_LIFE_TOKENS) for e in elapsed[on].tolist()])[:, None]
        self.weights[rows] *= decay
        self.hits[rows] *= decay
        self.tries[rows] *= decay
        self.generated[rows] = generated

    def observe(self, rows: np.ndarray, values: np.ndarray, lengths: np.ndarray) -> None:
        """Row rows[i] observes values[i, :lengths[i]], a prefix of its draft positions with values
        in [0, 1]. The rows are distinct (one lane per request in a round)."""
        w, m = self.weights[rows], self.means[rows]
        on = self._prefixes[lengths]  # row L: the first L positions
        self.means[rows] = np.where(on, (w * m + values) / (w + 1.0), m)
        self.weights[rows] = np.where(on, np.minimum(w + 1.0, WEIGHT_CAP), w)
        # Conditional evidence: position d was reached with the survival of d-1 and survived with
        # its own (a survival row's values are made nonincreasing, so hits <= tries).
        survived = np.minimum.accumulate(np.minimum(np.maximum(values, 0.0), 1.0), axis=1) * on
        reached = np.empty_like(survived)
        reached[:, 0] = 1.0
        reached[:, 1:] = survived[:, :-1]
        hits = self.hits[rows] + survived
        tries = self.tries[rows] + reached * on
        # The same cap as the means' weights: past 128 the evidence becomes a moving average.
        over = on & (tries > WEIGHT_CAP)
        if over.any():
            scale = np.where(over, WEIGHT_CAP / np.maximum(tries, WEIGHT_CAP), 1.0)
            hits *= scale
            tries *= scale
        self.hits[rows] = hits
        self.tries[rows] = tries

    def optimistic(self, row: int) -> np.ndarray:
        """Funded acceptance learning's bound: min(1, mean + sqrt(ln 20 / (2 * aged weight)))."""
        return np.minimum(1.0, self.means[row] + np.sqrt(CONFIDENCE_Z / (2.0 * self.weights[row])))

    def aged_weights(self, rows: np.ndarray, generated: np.ndarray) -> np.ndarray:
        """Weights aged to each row's current generated count, without storing the aging;
        rows without their own estimate stand at the starting weight: [len(rows), depth]."""
        elapsed = np.maximum(generated - self.generated[rows], 0)
        aged = self.weights[rows] * (0.5 ** (elapsed / HALF_LIFE_TOKENS))[:, None]
        return np.where(self.has[rows, None], aged, START_WEIGHT)

    def optimistic_rows(self, rows: np.ndarray, prior: PopulationPrior, generated: np.ndarray,
                        means: np.ndarray | None = None) -> np.ndarray:
        """`optimistic` for many rows at their aged weights (the prior stands in for rows without one);
        `means` replaces the rows' historical means (the CONDITIONAL estimate's survival)."""
        bonus = np.sqrt(CONFIDENCE_Z / (2.0 * self.aged_weights(rows, generated)))
        return np.minimum(1.0, (self.current(rows, prior) if means is None else means) + bonus)


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

    def __init__(self, depth: int, estimate: AcceptanceEstimate = AcceptanceEstimate.CONDITIONAL):
        self.depth = depth
        self.estimate = estimate
        self.acceptance_prior = {s: PopulationPrior(depth) for s in ProposalSource}
        self.forecast_prior = PopulationPrior(depth)

    def survival(self, cols: SpeculationColumns, rows: np.ndarray, source: ProposalSource) -> np.ndarray:
        est, prior = cols.acceptance[source], self.acceptance_prior[source]
        if self.estimate is AcceptanceEstimate.CONDITIONAL:
            return est.conditional(rows, prior)
        return est.current(rows, prior)

    def optimistic(self, cols: SpeculationColumns, rows: np.ndarray, source: ProposalSource,
                   generated: np.ndarray) -> np.ndarray:
        """Funded acceptance learning's bound on the scheduled survival, at the per-depth aged weights."""
        est, prior = cols.acceptance[source], self.acceptance_prior[source]
        return est.optimistic_rows(rows, prior, generated, self.survival(cols, rows, source))

    def forecast(self, cols: SpeculationColumns, rows: np.ndarray) -> np.ndarray:
        return cols.forecast.current(rows, self.forecast_prior)

    def observe_round(self, cols: SpeculationColumns, row: int, source: ProposalSource, generated: int,
                      accepted: int, offered: int, censored: bool, survival: np.ndarray | None = None) -> None:
        """One request's round: `observe_rounds` for one row."""
        self.observe_rounds(cols, np.array([row]), source, np.array([generated]), np.array([accepted]),
                            np.array([offered]), np.array([censored]), None if survival is None else [survival])

    def observe_rounds(self, cols: SpeculationColumns, rows: np.ndarray, source: ProposalSource,
                       generated: np.ndarray, accepted: np.ndarray, offered: np.ndarray, censored: np.ndarray,
                       survival: list | None = None) -> None:
        """A completed round of distinct requests, in lane order. Accepted prefixes are positive; a
        rejection is zero for every longer offered prefix; termination censors the remaining suffix.
        Survival rows (one per request, or None) replace binary observations."""
        keep = offered > 0  # width-one rounds measure cost, not acceptance
        last = np.where(censored, accepted, offered)[keep]
        accepted = accepted[keep]
        values = (np.arange(self.depth)[None, :] < accepted[:, None]).astype(float)
        if survival is not None:
            for i, s in enumerate(compress(survival, keep.tolist())):
                if s is not None:
                    n = min(len(s), int(last[i]))
                    values[i, :n] = s[:n]
        self._observe(cols.acceptance[source], self.acceptance_prior[source], rows[keep], generated[keep],
                      values, last)

    def observe_confidence(self, cols: SpeculationColumns, row: int, generated: int, joint: np.ndarray) -> None:
        """One request's completed joint-prefix probabilities: `observe_confidences` for one row."""
        self.observe_confidences(cols, np.array([row]), np.array([generated]), np.asarray(joint, dtype=float)[None, :],
                                 np.array([len(joint)]))

    def observe_confidences(self, cols: SpeculationColumns, rows: np.ndarray, generated: np.ndarray,
                            joint: np.ndarray, lengths: np.ndarray) -> None:
        """Row rows[i]'s completed joint-prefix probabilities joint[i, :lengths[i]], in lane order."""
        keep = lengths > 0
        values = np.zeros((int(np.count_nonzero(keep)), self.depth))
        width = min(self.depth, joint.shape[1])
        values[:, :width] = joint[keep, :width]
        self._observe(cols.forecast, self.forecast_prior, rows[keep], generated[keep], values,
                      np.minimum(lengths[keep], width))

    @staticmethod
    def _observe(est: PrefixColumns, prior: PopulationPrior, rows, generated, values, lengths) -> None:
        if not len(rows):
            return
        new = ~est.has[rows]
        starts = prior.observe_prefixes(values, lengths, new)
        if new.any():
            est.start(rows[new], starts, generated[new])
        est.age(rows, generated)
        est.observe(rows, values, lengths)


def expected_output(survival: np.ndarray, rows: int, alpha: float = 1.0) -> float:
    """1 + sum(s_1..s_(rows-1)) with each s raised to alpha; rows include the pending token."""
    if rows <= 1:
        return 1.0
    s = survival[: rows - 1]
    return 1.0 + float(np.sum(s ** alpha if alpha != 1.0 else s))

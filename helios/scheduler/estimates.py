"""What depends only on the cost table's estimates: the decode reference, the phases' normalizers
and the price coefficients calibrated to the measured time scale (docs/scheduling-utility.md),
cached against the table's version. Planning, commit and admission read it."""

from __future__ import annotations

from helios.scheduler.cost import CostTable
from helios.scheduler.service import PHYSICAL, reference_normalizers
from helios.scheduler.utility import DecodeReference


class Estimates:
    """(decode reference, normalizers, price coefficients), recomputed only when the cost table's
    version moves (a table without one, e.g. a baseline's time-dependent moving average,
    recomputes at every call)."""

    def __init__(self, costs, shapes, study, coeff):
        self.costs, self.shapes, self.study, self.coeff = costs, shapes, study, coeff
        self._cache, self._version = None, None

    def get(self) -> tuple:
        costs = self.costs
        version = getattr(costs, "version", None)
        if version is None or version != self._version or self._cache is None:
            if isinstance(costs, CostTable):
                estimates = costs.estimates_ns
            else:
                estimates = lambda shapes: [costs.estimate_ns(s) for s in shapes]  # noqa: E731
            # Every delivery-bearing family: one visible burst per lane, whatever its width.
            delivery, study = self.shapes.delivery, self.study
            decode = [(s.batch_capacity, t / 1e6) for s, t in zip(delivery, estimates(delivery)) if t is not None]
            norm = PHYSICAL
            if study.phase_normalized:
                prompts = self.shapes.prefill + self.shapes.scored_prefill
                prefill = [(s.token_capacity, t / 1e6) for s, t in zip(prompts, estimates(prompts)) if t is not None]
                norm = reference_normalizers(prefill, decode)
            coeff = self.coeff
            if study.fairness_time_scale:
                # The decode reference alone: what `norm` already holds when phase-normalized (the
                # same maximum over the same list), so it is not computed twice.
                log_decode = norm.log_decode if study.phase_normalized else reference_normalizers((), decode).log_decode
                coeff = coeff.time_scaled(log_decode)
            self._cache, self._version = (DecodeReference(decode), norm, coeff), version
        return self._cache

"""The protocol of one prerequisite kind (spec, "Prerequisites and completion"): work that
enables inference without producing output holds rows back from the planning view, proposes
candidates that compete by the same value per time, checks and records its plans at commit, and
advances its bookkeeping at completion. The kinds and the order of their steps are registered in
prerequisite_kinds.py; every hook has a no-op default, so a kind implements only its own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(slots=True)
class Built:
    """What a kind's factory may read: the catalog, configs and shape sets, and the kinds built
    before it (`kinds`, by name)."""

    catalog: object
    policy: object
    config: object
    shapes: object
    planned: bool  # the selector plans state operations (baselines do not)
    kinds: dict


@dataclass(slots=True)
class PlanInputs:
    """What a kind's candidates read besides the view and the cost lookup."""

    t: object  # RequestTable
    resources: object  # ResourcePool
    shapes: object  # ShapeSets
    coeff: object  # PriceCoefficients of this decision
    start_ns: int  # the queue's expected end: when the candidate would start


@dataclass(slots=True)
class Completed:
    """What a kind's completion step reads: the frame, its timing, the table and the costs now."""

    t: object  # RequestTable
    plan: object  # ScheduledPlan
    fence: int
    timing: object  # ExecutionTiming
    costs: object  # CostTable (or a baseline's)
    now_ns: int
    release: object  # row -> None: frees a retiring row's slot and pages


class Prerequisite:
    """The protocol of one prerequisite kind (no-op defaults)."""

    name = ""
    enabled = False  # False: the kind has no step (its admission check still runs)
    edits_output = False  # its completion step may change the frame's generated tokens

    # ---- admission and retirement --------------------------------------------------------
    def check(self, request, max_chunk):
        """Validate a request before anything changes (raise InvalidRequest); returns what
        `admitted` needs. `max_chunk()`: the most prompt tokens one chunk of its kind can take."""
        return None

    def admitted(self, handle, request, checked, estimate_ns) -> None:
        pass

    def forget(self, handle) -> None:
        """The request was cancelled."""

    def holds(self, handle) -> bool:
        """The kind keeps a finished request's row until its own graph ran."""
        return False

    def retired(self, handle) -> None:
        """The request's row is released."""

    def excluded(self) -> set:
        """Requests the automatic preemption policy must leave alone."""
        return set()

    # ---- the planning view and candidates ---------------------------------------------------
    def pending(self) -> bool:
        """Whether some request waits for this kind's work (a view is planned with no live row)."""
        return False

    def hold_back(self, t, rows: np.ndarray) -> np.ndarray:
        """`rows` without the requests that cannot be served before this kind's work."""
        return rows

    def log_scale(self, t, coeff) -> float:
        """The largest log price of the kind's lanes outside the view's pools (the scale's floor)."""
        return -math.inf

    def restrict(self, view, t) -> None:
        """Clip the view's prompt pools to the chunk ends the kind allows."""

    def waiting(self, log_scale: float) -> float:
        """Scaled waiting cost the kind adds to every candidate."""
        return 0.0

    def candidates(self, inputs: PlanInputs, view, costs) -> list:
        return []

    # ---- commit and completion -------------------------------------------------------------
    def check_commit(self, plan) -> bool:
        """Whether `plan` is this kind's to record (raise StalePlan when it cannot commit)."""
        return False

    def committed(self, plan) -> None:
        pass

    def may_retire(self) -> bool:
        """Whether a completion can retire a row though none of its lanes finished."""
        return False

    def completed(self, done: Completed, out: list) -> list:
        return out

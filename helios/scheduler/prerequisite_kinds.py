"""The registered prerequisite kinds (state operations, vision windows, anchor cuts), each a
`Prerequisite` (prerequisite.py). `KINDS` builds every kind; `ORDER` says, per hook, which kinds'
steps run and in which order. `Prerequisites` is what the scheduler holds: it loops over the steps of the kinds
the catalog and the scheduler enable (a kind that is off has no step, so a catalog without
snapshot, restore or vision graphs pays for none).

A new kind: a module with a `Prerequisite` subclass, one factory in `KINDS` and its steps in
`ORDER` (docs/architecture.md, "Adding a prerequisite kind").
"""

from __future__ import annotations

import math
import numpy as np

from helios.scheduler.anchors import AnchorKind
from helios.scheduler.prerequisite import Built, Completed, PlanInputs, Prerequisite
from helios.scheduler.prerequisites import StateKind
from helios.scheduler.vision_candidates import VisionKind


# Built in this order: a factory may read the kinds built before it.
KINDS = (
    ("state", StateKind.build),  # restores, terminal captures, preemption (checkpoints.py)
    ("vision", VisionKind.build),  # vision windows and their private snapshots (vision.py)
    ("anchors", AnchorKind.build),  # extra prefill cuts at message endpoints (anchors.py)
)

# Per hook, the steps (kind, method) in the order they run. The orders differ on purpose:
# - restrict: the vision clip replaces the pool's clip, the anchor clip composes with the one it
#   finds, so vision runs first;
# - candidates: tie-breaks fall to the first candidate of equal key, and the families have always
#   come as terminal snapshots, anchor snapshots, restores, then window operations;
# - completed: the capture allowance is earned from the frame's tokens before anchors and
#   captures resolve (a capture may remove a token from `out`), and window state advances last.
# The hold-back masks and the scale floor (a maximum) do not depend on the order.
ORDER = {
    "admitted": (("state", "admitted"), ("anchors", "admitted"), ("vision", "admitted")),
    "forget": (("state", "forget"), ("anchors", "forget")),
    "holds": (("state", "holds"),),
    "retired": (("vision", "retired"),),
    "excluded": (("vision", "excluded"), ("anchors", "excluded")),
    "pending": (("state", "pending"), ("vision", "pending"), ("anchors", "pending")),
    "hold_back": (("state", "hold_back"), ("vision", "hold_back"), ("anchors", "hold_back")),
    "log_scale": (("state", "log_scale"), ("vision", "log_scale"), ("anchors", "log_scale")),
    "restrict": (("vision", "restrict"), ("anchors", "restrict")),
    "waiting": (("state", "waiting"),),
    "candidates": (("state", "snapshot_candidates"), ("anchors", "candidates"),
                   ("state", "restore_candidates"), ("vision", "candidates")),
    "check_commit": (("vision", "check_commit"),),
    "may_retire": (("state", "may_retire"), ("vision", "may_retire")),
    "completed": (("state", "earn"), ("anchors", "completed"), ("state", "completed"), ("vision", "completed")),
}


class Prerequisites:
    """Every prerequisite kind of one scheduler, and the loops over their steps."""

    def __init__(self, built: Built):
        for name, factory in KINDS:
            built.kinds[name] = factory(built)
        self.kinds: dict[str, Prerequisite] = built.kinds
        on = {n: k for n, k in self.kinds.items() if k.enabled}
        self._steps = {hook: tuple(getattr(on[n], m) for n, m in steps if n in on) for hook, steps in ORDER.items()}
        self.edits_output = any(k.edits_output for k in on.values())
        self.active = bool(on)  # some kind is enabled (else every hook but `check` is empty)
        self.proposes = bool(self._steps["candidates"])  # some kind plans candidates
        self.completes = bool(self._steps["completed"])  # some kind has a completion step
        s = self._steps
        self._pending, self._hold_back, self._log_scale = s["pending"], s["hold_back"], s["log_scale"]
        self._restrict, self._waiting, self._candidates = s["restrict"], s["waiting"], s["candidates"]
        self._check_commit, self._may_retire, self._completed = s["check_commit"], s["may_retire"], s["completed"]

    # ---- admission and retirement --------------------------------------------------------
    def check(self, request, max_chunk) -> dict:
        """Every kind's admission check, enabled or not (a request a disabled kind would need is refused)."""
        return {n: k.check(request, max_chunk) for n, k in self.kinds.items()}

    def admitted(self, handle, request, checked: dict, estimate_ns) -> None:
        for step in self._steps["admitted"]:
            step(handle, request, checked[step.__self__.name], estimate_ns)

    def forget(self, handle) -> None:
        for step in self._steps["forget"]:
            step(handle)

    def holds(self, handle) -> bool:
        return any(step(handle) for step in self._steps["holds"])

    def retired(self, handle) -> None:
        for step in self._steps["retired"]:
            step(handle)

    def excluded(self) -> set:
        out = set()
        for step in self._steps["excluded"]:
            out |= step()
        return out

    # ---- the planning view and candidates ---------------------------------------------------
    def pending(self) -> bool:
        for step in self._pending:
            if step():
                return True
        return False

    def hold_back(self, t, rows: np.ndarray) -> np.ndarray:
        for step in self._hold_back:
            rows = step(t, rows)
        return rows

    def log_scale(self, t, coeff) -> float:
        floor = -math.inf
        for step in self._log_scale:
            floor = max(floor, step(t, coeff))
        return floor

    def restrict(self, view, t) -> None:
        for step in self._restrict:
            step(view, t)

    def waiting(self, log_scale: float) -> float:
        extra = 0.0
        for step in self._waiting:
            extra += step(log_scale)
        return extra

    def candidates(self, inputs: PlanInputs, view, costs) -> list:
        out = []
        for step in self._candidates:
            out += step(inputs, view, costs)
        return out

    # ---- commit and completion -------------------------------------------------------------
    def check_commit(self, plan) -> tuple:
        """The kinds whose plan this is, each checked (StalePlan) before anything changes."""
        return tuple(step.__self__ for step in self._check_commit if step(plan))

    def may_retire(self) -> bool:
        for step in self._may_retire:
            if step():
                return True
        return False

    def completed(self, done: Completed, out: list) -> list:
        for step in self._completed:
            out = step(done, out)
        return out

"""Mid-run changes for simulator demonstrations: graph durations that drift and acceptance that
changes mid-stream (the situations funded timing refresh and acceptance learning exist for)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable, Hashable, Sequence

import numpy as np

from helios.errors import ConfigError
from helios.graphs import GraphShape


@dataclass
class DriftingCostModel:
    """`base` durations, except that graphs matching `affected` take `factor` times as long while the
    device time this model has produced lies in [start_ns, end_ns) (end None: for good).

    Device time is the sum of the durations returned so far: in a closed-loop simulation the device
    is busy throughout, so it tracks simulated time without the engine knowing the clock."""

    base: object
    affected: Callable[[GraphShape], bool]
    factor: float = 1.3
    start_ns: int = 0
    end_ns: int | None = None
    produced_ns: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if self.factor <= 0:
            raise ConfigError("factor", f"must be positive, got {self.factor}")

    def drifting(self) -> bool:
        return self.start_ns <= self.produced_ns and (self.end_ns is None or self.produced_ns < self.end_ns)

    def duration_ns(self, shape: GraphShape, context_lens: Sequence[int], **kw) -> int:
        ns = self.base.duration_ns(shape, context_lens, **kw)
        if self.affected(shape) and self.drifting():
            ns = int(round(ns * self.factor))
        self.produced_ns += ns
        return ns


class PhasedAcceptance:
    """Each request follows `before` for its first `switch_rounds` speculative rounds (width one
    included), then `after`: low acceptance that turns high, as when a model starts copying code."""

    def __init__(self, before, after, switch_rounds: int):
        if switch_rounds < 0:
            raise ConfigError("switch_rounds", f"must be nonnegative, got {switch_rounds}")
        self.before, self.after, self.switch_rounds = before, after, switch_rounds
        self.rounds: dict[Hashable, int] = defaultdict(int)

    def conditional(self, request_key: Hashable, depth: int | None = None) -> np.ndarray:
        n = self.rounds[request_key]
        self.rounds[request_key] = n + 1
        model = self.before if n < self.switch_rounds else self.after
        return model.conditional(request_key, depth)

"""Speculative-decoding acceptance from measured per-position curves, with per-request variation.

The data file quotes vLLM's per-position acceptance rates: the fraction of drafts whose token at position
i (0-based) was accepted, which in vLLM's metrics implies every earlier position was accepted too. They
are therefore prefix-survival probabilities s_1..s_k; the rows check out, since 1 + sum(s_i) equals the
quoted mean acceptance length (3.64 for MTBench). The conditional rate at position i is s_i / s_{i-1}.
"""

from __future__ import annotations

import csv
import hashlib
import os
import re
from collections import defaultdict
from typing import Hashable, Sequence

import numpy as np

from helios.errors import ConfigError
from helios.sim.traces import data_file

ACCEPTANCE_FILE = "specdecode_per_position_acceptance_vllm_issues.csv"
DEFAULT_CURVE = "pr26498/mtbench"  # EAGLE in vLLM on MT-Bench, 10 positions
TAIL_POSITIONS = 3  # beyond the measured depth, continue with the mean of the last three conditional rates


def _read(path: str | os.PathLike[str] | None) -> tuple[dict[str, list[tuple[int, float]]], dict[str, str]]:
    curves: dict[str, list[tuple[int, float]]] = defaultdict(list)
    sources: dict[str, str] = {}
    last_setup = ""
    with open(data_file(ACCEPTANCE_FILE, path), newline="") as fh:
        for r in csv.DictReader(fh):
            setup = last_setup if r["setup"].strip() == "same" else r["setup"].strip()
            last_setup = setup
            pr = re.search(r"/pull/(\d+)", r["source_url"])
            key = f"pr{pr.group(1) if pr else 'x'}/{r['dataset'].strip().lower()}"
            curves[key].append((int(r["position"]), float(r["acceptance_rate"])))
            sources[key] = f"{setup} ({r['source_url']})"
    return curves, sources


def load_survival_curves(path: str | os.PathLike[str] | None = None) -> dict[str, np.ndarray]:
    """Prefix-survival probabilities s_1..s_k per curve, as quoted (key: 'pr<number>/<dataset>')."""
    curves, _ = _read(path)
    return {k: np.array([v for _, v in sorted(rows)]) for k, rows in curves.items()}


def load_acceptance_curves(path: str | os.PathLike[str] | None = None) -> dict[str, np.ndarray]:
    """Conditional per-position acceptance probabilities (s_i / s_{i-1}) per setup/dataset."""
    out = {}
    for key, s in load_survival_curves(path).items():
        prev = np.concatenate([[1.0], s[:-1]])
        out[key] = np.clip(np.divide(s, prev, out=np.zeros_like(s), where=prev > 0), 0.0, 1.0)
    return out


def acceptance_sources(path: str | os.PathLike[str] | None = None) -> dict[str, str]:
    """Where each curve comes from: the setup text and the pull request it was quoted from."""
    return _read(path)[1]


def _stable_seed(key: Hashable) -> int:
    # Python's hash() of str is salted per process; the simulator must replay identically across runs.
    return int.from_bytes(hashlib.blake2b(repr(key).encode(), digest_size=8).digest(), "little")


class AcceptanceModel:
    """Per-request acceptance: the curve's conditional rates times a per-request multiplier m.

    m = 2X with X ~ Beta(k, k), so E[m] = 1 and sd(m) = spread (k = (1/spread^2 - 1) / 2; spread in
    [0, 1), 0 means every request follows the curve exactly). A request's rates are min(alpha_i * m,
    max_rate): some requests (say, code or repetitive text) accept far more drafts than others, which is
    what makes adaptive speculation depth worth anything. m is drawn once per request from (seed, key),
    independently of call order, so a request keeps its character across rounds and across runs.
    Positions past the measured depth continue with the mean of the last three conditional rates.
    Because m is shared across positions, the population's mean survival at depth d is E[m^d] times the
    curve's, slightly above the quoted curve at deep positions when spread > 0.
    """

    def __init__(self, curve: str | Sequence[float] | np.ndarray = DEFAULT_CURVE, seed: int = 0,
                 spread: float = 0.25, *, max_rate: float = 0.99, path: str | os.PathLike[str] | None = None):
        if isinstance(curve, str):
            curves = load_acceptance_curves(path)
            if curve not in curves:
                raise ConfigError("curve", f"unknown acceptance curve {curve!r}; known: {sorted(curves)}")
            curve = curves[curve]
        alpha = np.asarray(curve, dtype=np.float64)
        if alpha.ndim != 1 or len(alpha) == 0 or np.any(alpha < 0) or np.any(alpha > 1):
            raise ConfigError("curve", "must be a nonempty 1-D sequence of probabilities")
        if not 0.0 <= spread < 1.0:
            raise ConfigError("spread", f"must be in [0, 1), got {spread}")
        if not 0.0 < max_rate <= 1.0:
            raise ConfigError("max_rate", f"must be in (0, 1], got {max_rate}")
        self.curve = alpha
        self.seed = int(seed)
        self.spread = float(spread)
        self.max_rate = float(max_rate)
        self.tail_rate = float(alpha[-TAIL_POSITIONS:].mean())
        self._beta_k = (1.0 / spread ** 2 - 1.0) / 2.0 if spread > 0 else None
        self._multipliers: dict[Hashable, float] = {}

    def multiplier(self, request_key: Hashable) -> float:
        m = self._multipliers.get(request_key)
        if m is None:
            if self._beta_k is None:
                m = 1.0
            else:
                rng = np.random.default_rng([self.seed, _stable_seed(request_key)])
                m = 2.0 * float(rng.beta(self._beta_k, self._beta_k))
            self._multipliers[request_key] = m
        return m

    def conditional(self, request_key: Hashable, depth: int | None = None) -> np.ndarray:
        """This request's conditional acceptance rate at positions 1..depth (default: the curve's)."""
        depth = len(self.curve) if depth is None else int(depth)
        if depth < 0:
            raise ConfigError("depth", f"must be nonnegative, got {depth}")
        base = self.curve[:depth]
        if depth > len(base):
            base = np.concatenate([base, np.full(depth - len(base), self.tail_rate)])
        return np.minimum(base * self.multiplier(request_key), self.max_rate)

    def survival(self, request_key: Hashable, depth: int | None = None) -> np.ndarray:
        """Cumulative prefix-survival s_1..s_depth: P(the first i drafts are all accepted)."""
        return np.cumprod(self.conditional(request_key, depth))

    def expected_accepted(self, request_key: Hashable, depth: int) -> float:
        return float(self.survival(request_key, depth).sum())

    def sample_accepted(self, request_key: Hashable, depth: int, rng: np.random.Generator) -> int:
        """Accepted drafts (0..depth) for one round that offers `depth` drafts: the first rejection stops it."""
        alpha = self.conditional(request_key, depth)
        draws = rng.random(len(alpha))
        rejected = np.flatnonzero(draws >= alpha)
        return int(rejected[0]) if len(rejected) else len(alpha)

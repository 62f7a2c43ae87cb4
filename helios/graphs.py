"""Prepared physical graphs: their kinds, their shape (the identity of a cost entry), the catalog.

Which graphs a catalog holds is decided in helios.prepare, from an engine's declared capacities."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Iterable, Iterator

from helios.errors import ConfigError


class GraphKind(Enum):
    """The native catalog's graph families."""

    PREFILL = "prefill"
    SCORED_PREFILL = "scored_prefill"
    DECODE = "decode"
    SPECULATIVE = "speculative"
    MIXED = "mixed"
    VISION = "vision"
    SNAPSHOT = "snapshot"
    RESTORE = "restore"
    # Not a prepared graph: one varlen forward over the real packed tokens of several requests (decodes
    # and prompt chunks together), as vLLM and Sarathi-Serve run an iteration. Never in a prepared
    # catalog; only an engine that can run such a forward (SimCore) executes it.
    PACKED = "packed"

    @property
    def produces_tokens(self) -> bool:
        return self in _TOKEN_KINDS

    @property
    def queueable(self) -> bool:
        # Only ordinary decode and complete speculative generation may occupy both frames.
        return self in (GraphKind.DECODE, GraphKind.SPECULATIVE)

    @property
    def is_prefill(self) -> bool:
        return self in (GraphKind.PREFILL, GraphKind.SCORED_PREFILL)


_TOKEN_KINDS = frozenset(
    {GraphKind.PREFILL, GraphKind.SCORED_PREFILL, GraphKind.DECODE, GraphKind.SPECULATIVE, GraphKind.MIXED,
     GraphKind.PACKED}
)


@dataclass(frozen=True, slots=True, order=True)
class GraphShape:
    """Identity of one prepared program and of its cost entry.

    batch_capacity   B: physical request rows
    token_capacity   W: query positions per row (decode 1, speculative W incl. the pending token,
                     prefill the prompt chunk per row, mixed the decode verification width)
    proposal_depth   D: captured proposal depth (speculative; 0 elsewhere)
    target_capacity  P: aggregate target rows; rectangular programs have P = B x W
    prefill_capacity prompt tokens of a mixed graph; zero for every other family
    prompt_rows      mixed graphs: how many rows may share prefill_capacity as one packed prompt
                     budget (1: the spec's one prompt row; more is the documented extension of
                     docs/packed-prompt-rows.md); one for every other family

    A packed forward (kind PACKED) has no physical shape: B is its sequence limit (max_num_seqs) and W
    its token budget (max_num_batched_tokens); its lanes say what it really runs.

    The active row count is deliberately absent: it never changes the identity.
    """

    kind: GraphKind
    batch_capacity: int
    token_capacity: int = 1
    proposal_depth: int = 0
    target_capacity: int = 0
    prefill_capacity: int = 0
    prompt_rows: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.kind, GraphKind):
            raise ConfigError("kind", f"not a GraphKind: {self.kind!r}")
        for name in ("batch_capacity", "token_capacity"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(name, f"must be a positive integer, got {value!r}")
        for name in ("proposal_depth", "target_capacity", "prefill_capacity"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise ConfigError(name, f"must be a nonnegative integer, got {value!r}")
        if self.target_capacity == 0:
            object.__setattr__(self, "target_capacity", self.batch_capacity * self.token_capacity)
        if self.target_capacity > self.batch_capacity * self.token_capacity:
            raise ConfigError("target_capacity", "P cannot exceed B x W")
        if self.kind is not GraphKind.MIXED and self.prefill_capacity:
            raise ConfigError("prefill_capacity", "only mixed graphs carry a prompt capacity")
        r = self.prompt_rows
        if isinstance(r, bool) or not isinstance(r, int) or r < 1:
            raise ConfigError("prompt_rows", f"must be a positive integer, got {r!r}")
        if r > 1 and (self.kind is not GraphKind.MIXED or r > self.batch_capacity):
            raise ConfigError("prompt_rows", f"only a mixed graph has several prompt rows, at most its "
                                             f"{self.batch_capacity} rows; got {r} for a {self.kind.value} graph")
        if self.kind is GraphKind.DECODE and (self.token_capacity != 1 or self.proposal_depth):
            raise ConfigError("token_capacity", "ordinary decode has width one and no proposals")
        if self.kind is GraphKind.SPECULATIVE:
            if self.token_capacity == 1 and self.proposal_depth != 0:
                raise ConfigError("proposal_depth", "width-one speculative programs have D = 0")
        elif self.kind is not GraphKind.MIXED and self.proposal_depth:
            raise ConfigError("proposal_depth", f"{self.kind.value} graphs have no proposals")
        if self.kind is GraphKind.MIXED:
            self._check_mixed()

    def _check_mixed(self) -> None:
        # The mixed execution contract. The upper bound on W (the core's completion token
        # capacity) is a property of the core, checked where its catalog is built (helios.prepare).
        b, w, c = self.batch_capacity, self.token_capacity, self.prefill_capacity
        if not 2 <= b <= 64 or b & (b - 1):
            raise ConfigError("batch_capacity", f"a mixed graph has a power-of-two 2..64 rows, got {b}")
        if c <= 0 or c % 64:
            raise ConfigError("prefill_capacity", f"a mixed graph's prompt capacity is a positive multiple "
                                                  f"of 64, got {c}")
        if c < w:
            raise ConfigError("prefill_capacity", f"{c} is below the decode width {w}: a decode-only "
                                                  "population must also fit")
        if self.proposal_depth > w - 1:
            raise ConfigError("proposal_depth", f"a width-{w} mixed graph has at most {w - 1} proposals")
        if not self.rectangular:
            raise ConfigError("target_capacity", "mixed decode rows are rectangular: P = B x W")

    @property
    def max_packed_extent(self) -> int:
        """Mixed graphs: prefill_capacity + (batch_capacity - 1) x token_capacity, the packed token
        extent of one full prompt row plus full decode rows (a decode-only population fits too,
        since the prompt capacity is at least the decode width). Several prompt rows share the
        prompt capacity, so they leave fewer decode rows and never a longer extent."""
        if self.kind is not GraphKind.MIXED:
            raise ConfigError("kind", f"only mixed graphs have a packed extent, not {self.kind.value}")
        return self.prefill_capacity + (self.batch_capacity - 1) * self.token_capacity

    @property
    def rectangular(self) -> bool:
        return self.target_capacity == self.batch_capacity * self.token_capacity

    def capacities(self) -> tuple[int, int, int, int, int]:
        return (self.batch_capacity, self.token_capacity, self.proposal_depth,
                self.target_capacity, self.prefill_capacity)

    def dominates(self, other: GraphShape) -> bool:
        """True when `other` is padding over this shape: all capacities >=, one strictly."""
        a, b = self.capacities(), other.capacities()
        return self.kind is other.kind and a != b and all(y >= x for x, y in zip(a, b))

    def label(self) -> str:
        k = self.kind.value
        if self.kind.is_prefill:
            return f"{k}[B={self.batch_capacity},C={self.token_capacity}]"
        if self.kind is GraphKind.SPECULATIVE:
            return (f"{k}[B={self.batch_capacity},D={self.proposal_depth},"
                    f"W={self.token_capacity},P={self.target_capacity}]")
        if self.kind is GraphKind.MIXED:
            rows = f",R={self.prompt_rows}" if self.prompt_rows > 1 else ""
            return f"{k}[B={self.batch_capacity},W={self.token_capacity},C={self.prefill_capacity}{rows}]"
        if self.kind is GraphKind.PACKED:
            return f"{k}[seqs<={self.batch_capacity},tokens<={self.token_capacity}]"
        return f"{k}[B={self.batch_capacity}]"


class Catalog:
    """The set of prepared graphs a core has loaded, in a stable order."""

    def __init__(self, shapes: Iterable[GraphShape]):
        unique = sorted(set(shapes), key=lambda s: (s.kind.value, s.capacities()))
        if not unique:
            raise ConfigError("catalog", "a catalog needs at least one graph")
        self._shapes = tuple(unique)
        self._by_kind: dict[GraphKind, tuple[GraphShape, ...]] = {}
        for shape in self._shapes:
            self._by_kind.setdefault(shape.kind, ())
            self._by_kind[shape.kind] += (shape,)

    def __iter__(self) -> Iterator[GraphShape]:
        return iter(self._shapes)

    def __len__(self) -> int:
        return len(self._shapes)

    def __contains__(self, shape: object) -> bool:
        return shape in self._by_kind.get(getattr(shape, "kind", None), ())

    def of_kind(self, kind: GraphKind) -> tuple[GraphShape, ...]:
        return self._by_kind.get(kind, ())

    def max_batch(self) -> int:
        return max(s.batch_capacity for s in self._shapes)

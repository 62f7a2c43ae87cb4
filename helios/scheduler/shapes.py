"""The catalog's graph families, as every selector (Helios's and the baselines') reads them."""

from __future__ import annotations

from dataclasses import dataclass

from helios.graphs import Catalog, GraphKind, GraphShape


@dataclass(frozen=True, slots=True)
class ShapeSets:
    decode: tuple[GraphShape, ...]
    prefill: tuple[GraphShape, ...]
    scored_prefill: tuple[GraphShape, ...]
    speculative: tuple[GraphShape, ...]  # empty unless speculation is on
    # Empty unless the selector uses mixed graphs; wider (W > 1) ones only with speculation on.
    mixed: tuple[GraphShape, ...] = ()

    @staticmethod
    def of(catalog: Catalog, speculation: bool, mixed: bool = True) -> "ShapeSets":
        """`mixed`: whether the selector runs mixed graphs (baselines never do)."""
        return ShapeSets(tuple(catalog.of_kind(GraphKind.DECODE)), tuple(catalog.of_kind(GraphKind.PREFILL)),
                         tuple(catalog.of_kind(GraphKind.SCORED_PREFILL)),
                         tuple(catalog.of_kind(GraphKind.SPECULATIVE)) if speculation else (),
                         tuple(s for s in catalog.of_kind(GraphKind.MIXED) if s.token_capacity == 1 or speculation)
                         if mixed else ())

    def prefill_of(self, kind: GraphKind) -> tuple[GraphShape, ...]:
        return self.scored_prefill if kind is GraphKind.SCORED_PREFILL else self.prefill

    @property
    def decode_steps(self) -> tuple[GraphShape, ...]:
        """The graphs that give a decoder its next token: decode, or with speculation loaded the
        narrowest programs that replace it (width one when adaptive, K + 1 when fixed). A
        prerequisite (anchor snapshot, restore) that enables a decode step is valued by these, at
        the pending token (the deferred step's rule: no wider gain is guessed)."""
        narrowest = min((s.token_capacity for s in self.speculative), default=None)
        return self.decode + tuple(s for s in self.speculative if s.token_capacity == narrowest)

    @property
    def delivery(self) -> tuple[GraphShape, ...]:
        """Every delivery-bearing family: one visible burst per lane, whatever its width. A mixed
        graph can deliver to all its rows (a decode-only population)."""
        return self.decode + self.speculative + self.mixed

    @property
    def rounds(self) -> bool:
        """Whether any loaded graph verifies proposals (separate or mixed wider rows)."""
        return bool(self.speculative) or any(s.token_capacity > 1 for s in self.mixed)

    @property
    def max_verification_width(self) -> int:
        """The widest decode verification across the separate and mixed catalogs (state rows)."""
        return max((s.token_capacity for s in self.speculative + self.mixed), default=1)

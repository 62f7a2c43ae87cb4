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

    @staticmethod
    def of(catalog: Catalog, speculation: bool) -> "ShapeSets":
        return ShapeSets(tuple(catalog.of_kind(GraphKind.DECODE)), tuple(catalog.of_kind(GraphKind.PREFILL)),
                         tuple(catalog.of_kind(GraphKind.SCORED_PREFILL)),
                         tuple(catalog.of_kind(GraphKind.SPECULATIVE)) if speculation else ())

    def prefill_of(self, kind: GraphKind) -> tuple[GraphShape, ...]:
        return self.scored_prefill if kind is GraphKind.SCORED_PREFILL else self.prefill

    @property
    def delivery(self) -> tuple[GraphShape, ...]:
        """Every delivery-bearing family: one visible burst per lane, whatever its width."""
        return self.decode + self.speculative

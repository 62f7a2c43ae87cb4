"""Speculative program coverage under the `--speculative-token-capacity` envelope R.

Each request bucket B gets one program per verification width W (pending token included) with
proposal depth D = W - 1. Rectangular programs need B x W <= R and declare P = B x W; where that
does not fit and ragged programs are enabled, the program is ragged with P = R. Width-one
programs (W = 1, D = 0) keep the draft context and exist at every bucket.
"""

from __future__ import annotations

from collections.abc import Iterable

from helios.errors import ConfigError
from helios.graphs import Catalog, GraphKind, GraphShape
from helios.prepare.ordinary import power_of_two_buckets


def speculative_shapes(max_batch: int, widths: Iterable[int], token_capacity: int,
                       ragged: bool = True) -> list[GraphShape]:
    widths = sorted(set(widths))
    if not widths or widths[0] < 1:
        raise ConfigError("widths", "verification widths are positive")
    if token_capacity < 1:
        raise ConfigError("speculative_token_capacity", "R must be positive")
    shapes = []
    for b in power_of_two_buckets(max_batch):
        for w in widths:
            d = w - 1
            if b * w <= token_capacity:
                shapes.append(GraphShape(GraphKind.SPECULATIVE, b, w, d, b * w))
            elif ragged and b < token_capacity and w <= token_capacity:
                shapes.append(GraphShape(GraphKind.SPECULATIVE, b, w, d, token_capacity))
    return shapes


def with_speculation(catalog: Catalog, max_batch: int, widths: Iterable[int], token_capacity: int,
                     ragged: bool = True) -> Catalog:
    """The catalog plus speculative programs; ordinary decode is replaced by width-one programs."""
    kept = [s for s in catalog if s.kind is not GraphKind.DECODE]
    return Catalog(kept + speculative_shapes(max_batch, widths, token_capacity, ragged))


def reduce_capacities(catalog: Catalog, *, max_width: int | None = None, max_batch: int | None = None,
                      token_capacity: int | None = None) -> Catalog:
    """Load-time selection: keep only the prepared programs inside the smaller limits.

    It never synthesizes a program; asking for limits that leave no prepared program of a
    family that was loaded is an error.
    """
    def keep(s: GraphShape) -> bool:
        if max_batch is not None and s.batch_capacity > max_batch:
            return False
        # Fixed-width limits apply to mixed and separate speculative graphs alike.
        if s.kind is GraphKind.MIXED and max_width is not None and s.token_capacity > max_width:
            return False
        if s.kind is GraphKind.SPECULATIVE:
            if max_width is not None and s.token_capacity > max_width:
                return False
            if token_capacity is not None and s.target_capacity > token_capacity:
                return False
        return True

    kept = [s for s in catalog if keep(s)]
    for kind in {s.kind for s in catalog}:
        if not any(s.kind is kind for s in kept):
            raise ConfigError("capacities", f"no prepared {kind.value} program fits the requested limits")
    return Catalog(kept)

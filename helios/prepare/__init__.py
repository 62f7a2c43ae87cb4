"""Catalog construction: every catalog is built here from an engine's declared Capacities
(power-of-two buckets, prefill chunks, the speculative envelope R, load-time reduction)."""

from helios.prepare.catalog import Capacities, build_catalog
from helios.prepare.mixed import check_mixed_widths, max_packed_extent, mixed_shapes, prompt_buckets
from helios.prepare.ordinary import ordinary_catalog, power_of_two_buckets, prefill_chunks
from helios.prepare.speculative import reduce_capacities, speculative_shapes, with_speculation

__all__ = ["Capacities", "build_catalog", "check_mixed_widths", "max_packed_extent", "mixed_shapes", "prompt_buckets",
           "ordinary_catalog", "power_of_two_buckets", "prefill_chunks",
           "reduce_capacities", "speculative_shapes", "with_speculation"]

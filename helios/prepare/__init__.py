"""Catalog construction: power-of-two request buckets, the speculative envelope R."""

from helios.prepare.speculative import reduce_capacities, speculative_shapes, with_speculation

__all__ = ["reduce_capacities", "speculative_shapes", "with_speculation"]

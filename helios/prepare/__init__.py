"""Catalog construction: power-of-two request buckets, the speculative envelope R."""

from helios.prepare.speculative import speculative_shapes, with_speculation

__all__ = ["speculative_shapes", "with_speculation"]

"""Ordinary graph coverage: power-of-two request buckets, prefill chunks, decode and prefill shapes."""

from __future__ import annotations

from typing import Iterable

from helios.errors import ConfigError
from helios.graphs import Catalog, GraphKind, GraphShape


def prefill_chunks(capacity: int) -> tuple[int, ...]:
    """Prefill graph capacities up to `capacity`: 64, 256, 1024, ... (powers of four) and it."""
    if capacity < 64 or capacity % 64:
        raise ConfigError("prefill_capacity", f"must be a positive multiple of 64, got {capacity}")
    chunks, c = {capacity}, 64
    while c < capacity:
        chunks.add(c)
        c *= 4
    return tuple(sorted(chunks))


def power_of_two_buckets(max_requests: int, smallest: int = 1) -> list[int]:
    """Request buckets captured through padded concurrency: smallest, 2*smallest, ... max."""
    if max_requests < 1:
        raise ConfigError("max_requests", "must be at least 1")
    buckets, b = [], smallest
    while b < max_requests:
        buckets.append(b)
        b *= 2
    buckets.append(max_requests)
    return sorted(set(buckets))


def ordinary_catalog(
    max_batch: int = 64,
    prefill_chunks: Iterable[int] = (64, 256, 1024, 4096),
    max_prefill_tokens: int | None = None,
    scored_prefill: bool = False,
) -> Catalog:
    """Decode at every power-of-two bucket; prefill at every (bucket, chunk) whose B x C fits.

    `max_prefill_tokens` bounds B x C of prefill graphs (the activation envelope); by default
    it is the largest chunk, so batched prefill is for short prompts only.
    """
    chunks = sorted(set(prefill_chunks))
    for c in chunks:
        if c <= 0 or c % 64:
            raise ConfigError("prefill_chunks", f"prompt capacities are positive multiples of 64, got {c}")
    envelope = max_prefill_tokens if max_prefill_tokens is not None else max(chunks)
    buckets = power_of_two_buckets(max_batch)
    shapes = [GraphShape(GraphKind.DECODE, b) for b in buckets]
    kinds = [GraphKind.PREFILL] + ([GraphKind.SCORED_PREFILL] if scored_prefill else [])
    for kind in kinds:
        shapes += [GraphShape(kind, b, c) for b in buckets for c in chunks if b * c <= envelope]
    return Catalog(shapes)

"""What every simulated cost model checks of a graph's rows, and what its token-parallel layers process."""

from __future__ import annotations

from typing import Sequence

from helios.errors import ConfigError
from helios.graphs import GraphKind, GraphShape


def linear_tokens(shape: GraphShape) -> int:
    """Tokens the token-parallel layers process: the physical (padded) size of the graph."""
    kind = shape.kind
    if kind.is_prefill:
        return shape.batch_capacity * shape.token_capacity
    if kind is GraphKind.DECODE:
        return shape.batch_capacity
    if kind is GraphKind.SPECULATIVE:
        return shape.target_capacity  # = B x W for rectangular programs
    if kind is GraphKind.MIXED:
        # The maximum packed extent: the prompt row holds up to C tokens, every other row up to W.
        return shape.prefill_capacity + (shape.batch_capacity - 1) * shape.token_capacity
    raise ConfigError("shape.kind", f"no timing model for {kind.value} graphs")


def check_rows(shape: GraphShape, context_lens: Sequence[int], chunks: Sequence[int] | None) -> None:
    if len(context_lens) > shape.batch_capacity:
        raise ConfigError("context_lens", f"{len(context_lens)} active rows exceed B={shape.batch_capacity}")
    if chunks is None:
        return
    if len(chunks) != len(context_lens):
        raise ConfigError("chunks", f"{len(chunks)} chunks for {len(context_lens)} active rows")
    if shape.kind.is_prefill and sum(chunks) > linear_tokens(shape):
        raise ConfigError("chunks", f"{sum(chunks)} packed prompt tokens exceed {shape.label()}'s "
                          f"{linear_tokens(shape)}")
    if shape.kind is GraphKind.MIXED:
        # Several prompt rows (up to shape.prompt_rows) share the prompt capacity as one packed budget.
        prompt = [c for c in chunks if c > 0]
        if len(prompt) > shape.prompt_rows or sum(prompt) > shape.prefill_capacity:
            rows = "one prompt row" if shape.prompt_rows == 1 else f"{shape.prompt_rows} prompt rows"
            raise ConfigError("chunks", f"a mixed graph has {rows} of at most "
                              f"{shape.prefill_capacity} tokens in all, got {prompt}")


def check_packed(chunks: Sequence[int], context_lens: Sequence[int]) -> None:
    if len(chunks) != len(context_lens) or not chunks:
        raise ConfigError("chunks", f"a packed forward needs one chunk per row, got {len(chunks)} for "
                          f"{len(context_lens)} rows")

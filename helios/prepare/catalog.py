"""Every catalog is built here, from the capacities an engine declares.

An engine (TorchCore, SimCore and its echo variant, a simulator setup) says what it can prepare:
its largest request bucket, its prefill chunks and their activation envelope, and its speculative
programs (verification widths and the envelope R). `build_catalog` turns that into the prepared
graphs: decode at every power-of-two bucket (or width-one speculative programs in its place),
prefill at every (bucket, chunk) inside the envelope, the speculative programs, and (with
`mixed_prefill`) the mixed prefill/generation graphs of `helios.prepare.mixed`.
"""

from __future__ import annotations

from dataclasses import dataclass

from helios.config import SpeculationMode
from helios.errors import ConfigError
from helios.graphs import Catalog, GraphKind, GraphShape
from helios.prepare.mixed import (DEFAULT_COMPLETION_TOKEN_CAPACITY, PROMPT_STEPS, check_mixed_widths,
                                  check_prompt_rows, check_prompt_steps, mixed_shapes)
from helios.prepare.ordinary import ordinary_catalog
from helios.prepare.speculative import with_speculation


@dataclass(frozen=True, slots=True)
class Capacities:
    """What an engine can prepare.

    max_batch                    largest request bucket (physical rows of a graph)
    prefill_chunks               prompt capacities per row, positive multiples of 64
    max_prefill_tokens           the B x C envelope of prefill graphs; None: the largest chunk
    scored_prefill               also prepare scored-prefill graphs at every prefill shape
    speculation                  off, or the speculative programs replace ordinary decode
    widths                       verification widths W (pending token included) of those programs
    speculative_token_capacity   R: aggregate target rows of one speculative program
    ragged                       where B x W exceeds R, prepare a ragged program with P = R
    mixed_prefill                also prepare mixed prefill/generation graphs (`--mixed-prefill`)
    completion_token_capacity    the core's bound on a mixed graph's decode width (8 when undeclared)
    mixed_prompt_steps           mixed prompt buckets per factor of four (3: the spec's worked example)
    mixed_prompt_capacity        the largest prompt chunk of a mixed graph, a multiple of 64 up to the
                                 largest prefill chunk (None: the largest prefill chunk); longer
                                 prompts still have the ordinary prefill graphs
    mixed_prompt_rows            rows of a mixed graph that may share its prompt capacity as one packed
                                 budget (1: the spec's one prompt row; docs/packed-prompt-rows.md)
    vision_feature_storage       prepared feature rows per vision window (0: no vision graphs). With it,
                                 VISION graphs B x storage at the power-of-two buckets up to
                                 min(max_batch, 8), and one-row SNAPSHOT and RESTORE graphs for the
                                 private window snapshots (SimCore; TorchCore has no vision tower)
    """

    max_batch: int
    prefill_chunks: tuple[int, ...]
    max_prefill_tokens: int | None = None
    scored_prefill: bool = False
    speculation: SpeculationMode = SpeculationMode.OFF
    widths: tuple[int, ...] = (1, 2, 4)
    speculative_token_capacity: int = 16
    ragged: bool = True
    mixed_prefill: bool = False
    completion_token_capacity: int = DEFAULT_COMPLETION_TOKEN_CAPACITY
    vision_feature_storage: int = 0
    mixed_prompt_steps: int = PROMPT_STEPS
    mixed_prompt_capacity: int | None = None
    mixed_prompt_rows: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "prefill_chunks", tuple(sorted(set(self.prefill_chunks))))
        object.__setattr__(self, "widths", tuple(sorted(set(self.widths))))
        object.__setattr__(self, "speculation", SpeculationMode(self.speculation))
        if isinstance(self.max_batch, bool) or not isinstance(self.max_batch, int) or self.max_batch < 1:
            raise ConfigError("max_batch", f"must be a positive integer, got {self.max_batch!r}")
        if not self.prefill_chunks:
            raise ConfigError("prefill_chunks", "an engine prepares at least one prefill chunk")
        if self.max_prefill_tokens is not None and self.max_prefill_tokens < min(self.prefill_chunks):
            raise ConfigError("max_prefill_tokens", f"{self.max_prefill_tokens} is below the smallest chunk")
        if not self.widths or self.widths[0] < 1:
            raise ConfigError("widths", f"verification widths are positive, got {self.widths!r}")
        if not isinstance(self.mixed_prefill, bool):
            raise ConfigError("mixed_prefill", f"must be a bool, got {self.mixed_prefill!r}")
        cap = self.completion_token_capacity
        if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
            raise ConfigError("completion_token_capacity", f"must be a positive integer, got {cap!r}")
        check_prompt_steps(self.mixed_prompt_steps)
        check_prompt_rows(self.mixed_prompt_rows)
        top = self.mixed_prompt_capacity
        if top is not None and (isinstance(top, bool) or not isinstance(top, int) or top < 64 or top % 64
                                or top > max(self.prefill_chunks)):
            raise ConfigError("mixed_prompt_capacity", f"must be a multiple of 64 from 64 up to the largest "
                                                       f"prefill chunk {max(self.prefill_chunks)}, got {top!r}")
        storage = self.vision_feature_storage
        if isinstance(storage, bool) or not isinstance(storage, int) or storage < 0:
            raise ConfigError("vision_feature_storage", f"must be a nonnegative integer, got {storage!r}")


def build_catalog(capacities: Capacities) -> Catalog:
    """The prepared graphs of an engine with these capacities."""
    c = capacities
    catalog = ordinary_catalog(c.max_batch, c.prefill_chunks, c.max_prefill_tokens, c.scored_prefill)
    if c.speculation is not SpeculationMode.OFF:
        catalog = with_speculation(catalog, c.max_batch, c.widths, c.speculative_token_capacity, c.ragged)
    if c.vision_feature_storage:
        catalog = Catalog(list(catalog) + vision_shapes(c.max_batch, c.vision_feature_storage))
    if not c.mixed_prefill:
        return catalog
    # The loaded decode mode picks the variant: zero drafts selects the ordinary mixed catalog.
    spec_on = c.speculation is not SpeculationMode.OFF
    drafts = max(c.widths) - 1 if spec_on else 0
    top = max(c.prefill_chunks) if c.mixed_prompt_capacity is None else c.mixed_prompt_capacity
    mixed = mixed_shapes(c.max_batch, top, drafts, c.speculative_token_capacity,
                         c.completion_token_capacity, c.widths, c.mixed_prompt_steps, c.mixed_prompt_rows)
    check_mixed_widths(mixed, c.completion_token_capacity)
    return Catalog(list(catalog) + mixed)


def vision_shapes(max_batch: int, storage: int) -> list[GraphShape]:
    """VISION graphs (one window of `storage` feature rows per row) at the power-of-two buckets up
    to min(max_batch, 8), and the one-row SNAPSHOT and RESTORE graphs a window boundary needs."""
    shapes, b = [], 1
    while b <= min(max_batch, 8):
        shapes.append(GraphShape(GraphKind.VISION, b, storage))
        b *= 2
    return shapes + [GraphShape(GraphKind.SNAPSHOT, 1), GraphShape(GraphKind.RESTORE, 1)]

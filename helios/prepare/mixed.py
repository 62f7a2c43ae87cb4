"""Mixed prefill/generation coverage (spec: "Mixed execution contract", the catalog rule).

Every batch bucket of at least two rows gets every prompt bucket at verification width one, plus,
in the speculative catalog, one prompt bucket for each wider width W within the target-token
envelope (B x W <= R). That bucket minimizes max(P / P_min, P_max / P), the worst multiplicative
distance to the shortest and longest prompt chunks; ties choose the smaller bucket.

The prompt-bucket ladder (the spec leaves it open): the ordinary prefill chunks are powers of four
(64, 256, 1024, 4096); the mixed ladder puts `steps` geometric steps in each factor of four
(ratio 4^(1/steps)), each rounded to the nearest multiple of 64, from 64 up to the largest chunk,
which is always a bucket. The default, three steps (ratio ~1.59), gives the spec's worked example
its ten buckets: 64, 128, 192, 256, 384, 640, 1024, 1600, 2560, 4096 for 4096. A prompt's last
chunk runs in the smallest bucket that holds it, so the ladder's ratio bounds the padding a prompt
tail pays; twelve steps (ratio ~1.12, 26 buckets for 4096) is the simulator's H100 setup
(helios.sim.experiment.Setup). Below 256 tokens the rounding to 64 leaves every ladder the same.

Speculative and ordinary variants: the speculative catalog's width-one graphs keep the draft
context (the scheduler's speculation mode says so; the shape identity is the same), and its wider
graphs have D = W - 1. Zero drafts selects the ordinary catalog: width one only. A loaded catalog
is one or the other, so the two variants never share a cost entry.

Worked example (the spec's): concurrency 4 (mixed buckets 2 and 4), 4096-token chunks, five
drafts, R = 6: 2 x 10 width-one graphs, plus W = 2 and W = 3 at B = 2 (B = 4 has no W >= 2 with
4 x W <= 6): 22 speculative and 20 ordinary mixed graphs.
"""

from __future__ import annotations

from collections.abc import Iterable
from fractions import Fraction

from helios.errors import ConfigError
from helios.graphs import Catalog, GraphKind, GraphShape
from helios.prepare.ordinary import power_of_two_buckets

# Eight when the core declares no completion token capacity.
DEFAULT_COMPLETION_TOKEN_CAPACITY = 8
MIXED_MAX_BATCH = 64
PROMPT_STEPS = 3  # geometric prompt buckets per factor of four (the spec's worked example)


def prompt_buckets(prefill_capacity: int, steps: int = PROMPT_STEPS) -> tuple[int, ...]:
    """The mixed prompt-bucket ladder up to `prefill_capacity`, `steps` buckets per factor of four
    (see the module docstring)."""
    if not isinstance(prefill_capacity, int) or prefill_capacity < 64 or prefill_capacity % 64:
        raise ConfigError("prefill_capacity", f"must be a positive multiple of 64, got {prefill_capacity!r}")
    check_prompt_steps(steps)
    buckets, k = {prefill_capacity}, 0
    # 64 * 4^(k/steps) below the capacity, rounded to the nearest multiple of 64 (half up).
    while (value := 64 * 4 ** (k / steps)) < prefill_capacity:
        buckets.add(min(prefill_capacity, 64 * int(value / 64 + 0.5)))
        k += 1
    return tuple(sorted(buckets))


def check_prompt_rows(rows: int) -> None:
    if isinstance(rows, bool) or not isinstance(rows, int) or not 1 <= rows <= MIXED_MAX_BATCH:
        raise ConfigError("mixed_prompt_rows", f"must be an integer from 1 to {MIXED_MAX_BATCH}, got {rows!r}")


def check_prompt_steps(steps: int) -> None:
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ConfigError("mixed_prompt_steps", f"must be a positive integer, got {steps!r}")


def balanced_bucket(buckets: Iterable[int]) -> int:
    """The bucket minimizing max(P / P_min, P_max / P); ties choose the smaller bucket."""
    ladder = sorted(buckets)
    low, high = ladder[0], ladder[-1]
    # Exact ratios: a float could break a tie the spec resolves toward the smaller bucket.
    return min(ladder, key=lambda p: (max(Fraction(p, low), Fraction(high, p)), p))


def mixed_shapes(max_batch: int, prefill_capacity: int, drafts: int = 0, token_capacity: int = 16,
                 completion_token_capacity: int = DEFAULT_COMPLETION_TOKEN_CAPACITY,
                 widths: Iterable[int] | None = None, prompt_steps: int = PROMPT_STEPS,
                 prompt_rows: int = 1) -> list[GraphShape]:
    """The mixed graphs of a core.

    max_batch                   largest request bucket (concurrency); mixed buckets are its
                                power-of-two buckets from 2 (at most 64)
    prefill_capacity            the largest prompt chunk (top of the prompt ladder)
    drafts                      proposal depth of the loaded decode mode; 0 selects the ordinary catalog
    token_capacity              R, the target-token envelope of wider graphs: B x W <= R
    completion_token_capacity   the core's bound on W (8 when it declares none)
    widths                      wider widths the core prepares (default: every W in 2..drafts + 1)
    prompt_steps                prompt buckets per factor of four (`prompt_buckets`)
    prompt_rows                 rows that may share a graph's prompt capacity (docs/packed-prompt-rows.md):
                                each graph takes min(prompt_rows, B); the shapes themselves are the same
                                for every value, so the catalog's size does not grow with it
    """
    if not isinstance(drafts, int) or drafts < 0:
        raise ConfigError("drafts", f"must be a nonnegative integer, got {drafts!r}")
    if not isinstance(completion_token_capacity, int) or completion_token_capacity < 1:
        raise ConfigError("completion_token_capacity", f"must be a positive integer, got {completion_token_capacity!r}")
    if token_capacity < 1:
        raise ConfigError("speculative_token_capacity", "R must be positive")
    check_prompt_rows(prompt_rows)
    buckets = [b for b in power_of_two_buckets(min(max_batch, MIXED_MAX_BATCH)) if b >= 2]
    prompts = prompt_buckets(prefill_capacity, prompt_steps)
    shapes = [GraphShape(GraphKind.MIXED, b, 1, 0, 0, c, min(prompt_rows, b)) for b in buckets for c in prompts]
    if drafts == 0:
        return shapes
    wider = sorted({w for w in (range(2, drafts + 2) if widths is None else widths)
                    if 2 <= w <= min(drafts + 1, completion_token_capacity)})
    balanced = balanced_bucket(prompts)
    for b in buckets:
        shapes += [GraphShape(GraphKind.MIXED, b, w, w - 1, 0, max(balanced, w), min(prompt_rows, b))
                   for w in wider if b * w <= token_capacity]
    return shapes


def check_mixed_widths(shapes: Iterable[GraphShape], completion_token_capacity: int) -> None:
    """The contract's upper bound on W, which only the core knows: raise naming the field."""
    for s in shapes:
        if s.kind is GraphKind.MIXED and s.token_capacity > completion_token_capacity:
            raise ConfigError("token_capacity", f"{s.label()} verifies {s.token_capacity} positions per row; "
                                                f"the core's completion token capacity is {completion_token_capacity}")


def max_packed_extent(catalog: Catalog | Iterable[GraphShape]) -> int | None:
    """The largest packed token extent of the catalog's mixed graphs (capture headroom); None
    when it holds none."""
    extents = [s.max_packed_extent for s in catalog if s.kind is GraphKind.MIXED]
    return max(extents) if extents else None

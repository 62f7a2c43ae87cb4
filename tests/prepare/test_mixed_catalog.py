"""`helios.prepare.mixed_shapes`: the spec's mixed catalog rule and its worked example."""

from collections import Counter

import pytest

from helios.config import SpeculationMode
from helios.errors import ConfigError
from helios.graphs import GraphKind, GraphShape
from helios.prepare import (Capacities, build_catalog, check_mixed_widths, max_packed_extent, mixed_shapes,
                            prompt_buckets, reduce_capacities)
from helios.prepare.mixed import balanced_bucket


def test_the_spec_worked_example_gives_22_speculative_and_20_ordinary_mixed_graphs():
    # Concurrency 4, 4096-token chunks, five drafts, token capacity (R) 6.
    speculative = mixed_shapes(4, 4096, drafts=5, token_capacity=6)
    ordinary = mixed_shapes(4, 4096, drafts=0, token_capacity=6)
    assert len(speculative) == 22 and len(ordinary) == 20
    assert len(set(speculative)) == 22
    # Width one at every prompt bucket of buckets 2 and 4; W = 2, 3 at B = 2 (2 x 3 <= 6).
    assert Counter(s.batch_capacity for s in ordinary) == {2: 10, 4: 10}
    wide = sorted((s.batch_capacity, s.token_capacity, s.proposal_depth, s.prefill_capacity)
                  for s in speculative if s.token_capacity > 1)
    assert wide == [(2, 2, 1, 640), (2, 3, 2, 640)]
    assert set(ordinary) <= set(speculative)
    assert max_packed_extent(speculative) == 4096 + 3 and max_packed_extent(ordinary) == 4096 + 3


def test_the_default_prompt_ladder_has_three_steps_per_factor_of_four_as_in_the_spec_example():
    assert prompt_buckets(4096) == (64, 128, 192, 256, 384, 640, 1024, 1600, 2560, 4096)
    assert prompt_buckets(1024) == (64, 128, 192, 256, 384, 640, 1024)
    assert prompt_buckets(64) == (64,)
    assert prompt_buckets(2048)[-2:] == (1600, 2048)  # the largest chunk is always a bucket
    for c in (64, 1024, 2048, 4096, 8192):
        assert all(b % 64 == 0 and 64 <= b <= c for b in prompt_buckets(c))
    with pytest.raises(ConfigError):
        prompt_buckets(100)


def test_a_finer_ladder_puts_twelve_steps_in_each_factor_of_four():
    assert prompt_buckets(4096, 12) == (64, 128, 192, 256, 320, 384, 448, 512, 576, 640, 704, 832, 896, 1024, 1152,
                                        1280, 1472, 1600, 1856, 2048, 2304, 2560, 2880, 3264, 3648, 4096)
    # Below 256 tokens the rounding to 64 leaves every ladder alike (flare run's default capacity).
    assert prompt_buckets(256, 12) == prompt_buckets(256) == (64, 128, 192, 256)
    assert balanced_bucket(prompt_buckets(4096, 12)) == 512  # sqrt(64 x 4096) is on this ladder
    for steps in (0, -1, 1.5, True):
        with pytest.raises(ConfigError, match="mixed_prompt_steps"):
            prompt_buckets(4096, steps)


@pytest.mark.parametrize("steps", [1, 2, 3, 6, 12])
def test_every_chunk_pads_by_at_most_the_ladder_ratio_and_the_rounding(steps):
    # Exhaustive over every chunk length n up to the capacity; its bucket is the smallest one holding
    # it. The first geometric value 64 * 4^(k/steps) at or above n + 32 rounds to a multiple of 64 that
    # holds n, and its predecessor was below n + 32, so the bucket is below (n + 32) * ratio + 32.
    ratio = 4 ** (1 / steps)
    for capacity in (1024, 4096, 8192):
        ladder = prompt_buckets(capacity, steps)
        assert ladder[-1] == capacity and all(b % 64 == 0 for b in ladder)
        bucket = [None] * (capacity + 1)
        i = len(ladder) - 1
        for n in range(capacity, 0, -1):
            while i > 0 and ladder[i - 1] >= n:
                i -= 1
            bucket[n] = ladder[i]
        assert all(n <= bucket[n] < (n + 32) * ratio + 32 for n in range(1, capacity + 1))


def test_capacities_carry_the_ladder_into_the_catalog():
    coarse = build_catalog(Capacities(16, (64, 4096), mixed_prefill=True))
    fine = build_catalog(Capacities(16, (64, 4096), mixed_prefill=True, mixed_prompt_steps=12))
    ladder = lambda c: sorted({s.prefill_capacity for s in c.of_kind(GraphKind.MIXED)})  # noqa: E731
    assert ladder(coarse) == list(prompt_buckets(4096)) and ladder(fine) == list(prompt_buckets(4096, 12))
    assert len(fine.of_kind(GraphKind.MIXED)) == 4 * 26  # buckets 2, 4, 8, 16
    with pytest.raises(ConfigError, match="mixed_prompt_steps"):
        Capacities(16, (64,), mixed_prefill=True, mixed_prompt_steps=0)


def test_a_mixed_prompt_capacity_tops_the_ladder_and_leaves_the_prefill_graphs():
    caps = Capacities(16, (64, 256, 1024, 4096), mixed_prefill=True, mixed_prompt_steps=12, mixed_prompt_capacity=2048)
    catalog = build_catalog(caps)
    assert sorted({s.prefill_capacity for s in catalog.of_kind(GraphKind.MIXED)}) == list(prompt_buckets(2048, 12))
    assert max(s.token_capacity for s in catalog.of_kind(GraphKind.PREFILL)) == 4096
    assert max_packed_extent(catalog) == 2048 + 15
    full = build_catalog(Capacities(16, (64, 256, 1024, 4096), mixed_prefill=True, mixed_prompt_steps=12))
    assert max_packed_extent(full) == 4096 + 15
    for top in (0, 100, 8192, True, 2048.0):
        with pytest.raises(ConfigError, match="mixed_prompt_capacity"):
            Capacities(16, (64, 4096), mixed_prefill=True, mixed_prompt_capacity=top)


def test_the_wider_bucket_balances_short_and_long_prompts_ties_to_the_smaller():
    ladder = prompt_buckets(4096)
    # max(P/64, 4096/P): 384 -> 10.67, 640 -> 10, 1024 -> 16.
    assert balanced_bucket(ladder) == 640
    assert balanced_bucket((64, 512, 4096)) == 512
    assert balanced_bucket((64, 128, 256)) == 128
    assert balanced_bucket((64, 256, 1024, 4096)) == 256  # 256 and 1024 tie at 16: the smaller


def test_single_row_buckets_get_no_mixed_graph_and_buckets_stop_at_64():
    assert mixed_shapes(1, 1024) == []
    assert max(s.batch_capacity for s in mixed_shapes(256, 64)) == 64


def test_widths_are_bounded_by_drafts_the_completion_capacity_and_the_envelope():
    shapes = mixed_shapes(16, 1024, drafts=9, token_capacity=64, completion_token_capacity=8)
    assert max(s.token_capacity for s in shapes) == 8
    assert all(s.batch_capacity * s.token_capacity <= 64 for s in shapes if s.token_capacity > 1)
    only = mixed_shapes(4, 1024, drafts=5, token_capacity=16, widths=(1, 2, 4))
    assert {s.token_capacity for s in only} == {1, 2, 4}


def test_build_catalog_adds_mixed_graphs_matching_the_decode_mode():
    base = dict(max_batch=4, prefill_chunks=(64, 256, 1024, 4096), widths=(1, 2, 3, 4, 5, 6),
                speculative_token_capacity=6)
    assert not build_catalog(Capacities(**base)).of_kind(GraphKind.MIXED)
    ordinary = build_catalog(Capacities(**base, mixed_prefill=True))
    speculative = build_catalog(Capacities(**base, mixed_prefill=True, speculation=SpeculationMode.ADAPTIVE))
    assert len(ordinary.of_kind(GraphKind.MIXED)) == 20  # zero drafts: the ordinary catalog
    assert len(speculative.of_kind(GraphKind.MIXED)) == 22
    assert max_packed_extent(ordinary) == 4099 and max_packed_extent(build_catalog(Capacities(**base))) is None


def test_the_completion_token_capacity_bounds_the_decode_width():
    with pytest.raises(ConfigError) as err:
        check_mixed_widths([GraphShape(GraphKind.MIXED, 2, 6, 5, 0, 64)], completion_token_capacity=4)
    assert err.value.field == "token_capacity"
    with pytest.raises(ConfigError):
        Capacities(4, (64,), completion_token_capacity=0)
    with pytest.raises(ConfigError):
        Capacities(4, (64,), mixed_prefill="yes")


def test_fixed_width_limits_apply_to_mixed_graphs_too():
    catalog = build_catalog(Capacities(4, (64, 1024), widths=(1, 2, 4), speculative_token_capacity=16,
                                       speculation=SpeculationMode.FIXED, mixed_prefill=True))
    reduced = reduce_capacities(catalog, max_width=2)
    assert max(s.token_capacity for s in reduced.of_kind(GraphKind.MIXED)) == 2

"""The simulator's automatic prefix cache: block-hash chains, hits, LRU eviction within a memory bound."""

from __future__ import annotations

import pytest

from helios.errors import ConfigError
from helios.sim.prefix_cache import PrefixCache

B = 512


def _served(cache: PrefixCache, handle: int, blocks, prompt: int) -> int:
    """Admit a request, compute its whole prompt, return its cached tokens (it stays referenced)."""
    cached = cache.admit(handle, blocks, prompt)
    cache.computed(handle, prompt)
    return cached


def test_a_hit_is_the_longest_leading_chain_of_full_blocks():
    c = PrefixCache(B)
    assert _served(c, 1, (7, 8, 9), 3 * B) == 0  # cold
    c.release(1)
    # Same first two blocks, different third: exactly two blocks are skipped.
    assert c.admit(2, (7, 8, 5, 6), 4 * B) == 2 * B
    # A block id seen before, but after a different head, is a different chain: no hit at all.
    assert c.admit(3, (1, 8, 9), 3 * B) == 0
    assert (8,) not in c and (7, 8) in c


def test_at_least_one_prompt_token_is_computed_and_partial_tail_blocks_are_never_cached():
    c = PrefixCache(B)
    _served(c, 1, (1, 2), 2 * B)
    c.release(1)
    assert c.admit(2, (1, 2), 2 * B) == 2 * B - 1  # a full hit still computes the last token
    _served(c, 3, (4, 5), B + 100)  # the second block is partial
    assert (4,) in c and (4, 5) not in c
    assert c.match((4, 5), B + 100) == B


def test_computed_publishes_only_blocks_the_prefill_completed():
    c = PrefixCache(B)
    c.admit(1, (1, 2, 3), 3 * B)
    c.computed(1, B + 10)  # a first chunk of 522 tokens completes one block
    assert (1,) in c and (1, 2) not in c
    assert c.admit(2, (1, 2, 3), 3 * B) == B  # a concurrent request reuses the completed block
    c.computed(1, 3 * B)
    assert c.refs((1,)) == 2 and c.refs((1, 2, 3)) == 1


def test_eviction_is_lru_over_unreferenced_blocks_deepest_first():
    c = PrefixCache(B, capacity_blocks=3)
    _served(c, 1, (1, 2), 2 * B)
    _served(c, 2, (3, 4), 2 * B)
    assert len(c) == 4 and c.fit(100) == 0  # everything is referenced: over the cap, but nothing evictable
    c.release(1)
    assert c.unreferenced() == [(1, 2), (1,)]  # the deepest block first
    assert c.fit(100) == 1 and (1, 2) not in c and (1,) in c
    c.release(2)
    c.admit(3, (1, 9), 2 * B)  # touching (1,) makes it referenced again: the older blocks go first
    assert c.fit(0) == 2 and len(c) == 1 and (1,) in c and c.refs((1,)) == 1


def test_free_memory_bounds_the_unreferenced_blocks():
    c = PrefixCache(B)
    for h in range(4):
        _served(c, h, (10 * h, 10 * h + 1), 2 * B)
    c.release(0)
    c.release(1)
    assert c.fit(3) == 1 and len(c.unreferenced()) == 3  # 4 unreferenced blocks, room for 3
    assert c.fit(0) == 3 and len(c) == 4  # the 4 referenced blocks stay
    assert all(c.refs(ch) == 1 for ch in [(20,), (20, 21), (30,), (30, 31)])


def test_an_evicted_head_makes_its_descendants_unreachable_until_it_returns():
    c = PrefixCache(B)
    _served(c, 1, (1, 2), 2 * B)
    c.release(1)
    c.admit(2, (1, 2), 2 * B)  # pin both, then release in an order that puts the head first
    c.release(2)
    c._lru.move_to_end((1, 2))  # (1,) least recent: evict it alone
    assert c.fit(1) == 1 and (1,) not in c and (1, 2) in c
    assert c.match((1, 2), 3 * B) == 0  # the chain breaks at the missing head
    _served(c, 3, (1, 5), 2 * B)  # the head is computed again
    assert c.match((1, 2), 3 * B) == 2 * B


def test_stats_and_validation():
    c = PrefixCache(B)
    _served(c, 1, (1, 2), 2 * B)
    c.release(1)
    c.admit(2, (1, 3), 2 * B)
    s = c.stats()
    assert (s.lookups, s.hit_blocks, s.saved_tokens, s.inserted_blocks, s.cached_blocks) == (2, 1, B, 2, 2)
    with pytest.raises(ConfigError):
        c.admit(2, (1,), B)
    with pytest.raises(ConfigError):
        PrefixCache(0)
    with pytest.raises(ConfigError):
        PrefixCache(B, capacity_blocks=-1)

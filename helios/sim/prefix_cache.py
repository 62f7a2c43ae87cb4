"""Automatic prefix caching for the simulator, keyed by block-hash chains (the Mooncake trace's hash_ids).

The model is vLLM's automatic prefix caching (APC), on the block hashes a trace gives:

- A prompt is a sequence of fixed-size blocks (Mooncake: 512 tokens), each named by a hash id. A block
  is identified by its whole chain, the ids of every block up to and including it, so a block is
  reusable only when every earlier block of the request matches too (vLLM hashes the parent's hash into
  each block's). Only full blocks are cached: a prompt's partial tail block is always recomputed.
- A request's hit is the longest leading run of its blocks present in the cache, taken at admission. The
  hit blocks are pinned (referenced) until the request is detached, so nothing it relies on disappears
  before its prefill ran. The cached tokens are min(hit x block, prompt - 1): at least one prompt token
  is always computed, as in vLLM, so the request still samples its first token from a forward.
- A block enters the cache when a prefill chunk completes it (`computed`), referenced by that request.
  A request's references end when it is detached; its blocks then join the LRU list of unreferenced
  blocks, its last block first, so a prompt's deepest blocks are evicted before its shared head (vLLM's
  free queue does the same).
- Memory: unreferenced cached blocks live in KV pages nobody reserved. `fit(free_blocks)` evicts the
  least recently used unreferenced blocks until they fit the pages the scheduler's pool has free, and,
  with `capacity_blocks`, until the whole cache fits that cap. Referenced blocks are never evicted: they
  lie in the pages of the requests using them (every request reserves its whole extent, cached prefix
  included, so a hit saves prefill work but never raises concurrency; the same for every scheduler).

Pure bookkeeping: no clock, no I/O. helios.sim.loop drives it.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Sequence

from helios.errors import ConfigError

Chain = tuple[int, ...]


@dataclass(frozen=True, slots=True)
class PrefixCacheStats:
    """Counters of one run: lookups, blocks hit, tokens the hits saved, blocks inserted and evicted."""

    lookups: int
    hit_blocks: int
    saved_tokens: int
    inserted_blocks: int
    evicted_blocks: int
    cached_blocks: int


class PrefixCache:
    def __init__(self, block_tokens: int, capacity_blocks: int | None = None, page_tokens: int = 16):
        for name, v in (("block_tokens", block_tokens), ("page_tokens", page_tokens)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(name, f"must be a positive integer, got {v!r}")
        if capacity_blocks is not None and (isinstance(capacity_blocks, bool) or not isinstance(capacity_blocks, int)
                                            or capacity_blocks < 0):
            raise ConfigError("capacity_blocks", f"must be a nonnegative integer or None, got {capacity_blocks!r}")
        self.block_tokens = block_tokens
        self.capacity_blocks = capacity_blocks
        self.page_tokens = page_tokens  # the KV pool's page size: `blocks_in` converts free pages
        self._refs: dict[Chain, int] = {}  # every cached block: its chain -> live requests using it
        self._lru: OrderedDict[Chain, None] = OrderedDict()  # unreferenced blocks, least recent first
        self._held: dict[int, list[Chain]] = {}  # handle -> blocks it references, in prompt order
        self._blocks: dict[int, tuple[tuple[int, ...], int]] = {}  # handle -> (hash ids, prompt tokens)
        self.lookups = self.hit_blocks = self.saved_tokens = self.inserted = self.evicted = 0

    # ---- queries ------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._refs)

    def __contains__(self, chain: Chain) -> bool:
        return tuple(chain) in self._refs

    def refs(self, chain: Chain) -> int:
        return self._refs.get(tuple(chain), 0)

    def unreferenced(self) -> list[Chain]:
        """Unreferenced blocks, least recently used first (the eviction order)."""
        return list(self._lru)

    @property
    def unreferenced_count(self) -> int:
        return len(self._lru)

    def blocks_in(self, pages: int) -> int:
        """Whole blocks that fit `pages` KV pages."""
        return max(pages, 0) * self.page_tokens // self.block_tokens

    def full_blocks(self, blocks: Sequence[int], prompt_tokens: int) -> int:
        """How many of `blocks` the prompt fills completely (only those can be cached)."""
        return min(len(blocks), prompt_tokens // self.block_tokens)

    def stats(self) -> PrefixCacheStats:
        return PrefixCacheStats(self.lookups, self.hit_blocks, self.saved_tokens, self.inserted, self.evicted,
                                len(self._refs))

    # ---- admission ------------------------------------------------------------------------
    def hit(self, blocks: Sequence[int], prompt_tokens: int) -> list[Chain]:
        """The cached chains a prompt would reuse: its longest leading run of full blocks in the cache."""
        blocks = tuple(int(b) for b in blocks)
        out = []
        for i in range(self.full_blocks(blocks, prompt_tokens)):
            chain = blocks[: i + 1]
            if chain not in self._refs:
                break  # a chain is reusable only when every earlier block matched
            out.append(chain)
        return out

    def match(self, blocks: Sequence[int], prompt_tokens: int) -> int:
        """The prompt tokens a hit would save (changes nothing): at least one token is always computed."""
        return self._saved(len(self.hit(blocks, prompt_tokens)), prompt_tokens)

    def admit(self, handle: int, blocks: Sequence[int], prompt_tokens: int) -> int:
        """Look up a new request's prefix, pin the blocks it hits; returns its cached prompt tokens."""
        if handle in self._blocks:
            raise ConfigError("handle", f"request {handle} is already in the prefix cache")
        blocks = tuple(int(b) for b in blocks)
        self._blocks[handle] = (blocks, int(prompt_tokens))
        held = self._held[handle] = self.hit(blocks, prompt_tokens)
        for chain in held:
            self._ref(chain)
        self.lookups += 1
        cached = self._saved(len(held), prompt_tokens)
        self.hit_blocks += len(held)
        self.saved_tokens += cached
        return cached

    # ---- progress and release -----------------------------------------------------------------
    def computed(self, handle: int, prompt_done: int) -> None:
        """A prefill chunk of `handle` completed: its prompt is computed up to `prompt_done` tokens, and
        every full block below that enters the cache (or, already there, gains this reference)."""
        entry = self._blocks.get(handle)
        if entry is None:
            return
        blocks, prompt = entry
        held = self._held[handle]
        upto = min(self.full_blocks(blocks, prompt), int(prompt_done) // self.block_tokens)
        for i in range(len(held), upto):
            chain = blocks[: i + 1]
            if chain not in self._refs:
                self._refs[chain] = 0
                self.inserted += 1
            self._ref(chain)
            held.append(chain)

    def release(self, handle: int) -> None:
        """`handle` was detached: its blocks stay cached, unreferenced ones joining the LRU list deepest first."""
        self._blocks.pop(handle, None)
        for chain in reversed(self._held.pop(handle, [])):
            n = self._refs[chain] - 1
            self._refs[chain] = n
            if n == 0:
                self._lru[chain] = None  # most recently used end

    def fit(self, free_blocks: int) -> int:
        """Evict LRU unreferenced blocks until they fit `free_blocks` (the unreserved KV memory) and the
        whole cache fits `capacity_blocks`; returns how many were evicted."""
        before = self.evicted
        while self._lru and (len(self._lru) > max(free_blocks, 0) or (
                self.capacity_blocks is not None and len(self._refs) > self.capacity_blocks)):
            chain, _ = self._lru.popitem(last=False)
            del self._refs[chain]
            self.evicted += 1
        return self.evicted - before

    def _saved(self, hit_blocks: int, prompt_tokens: int) -> int:
        return min(hit_blocks * self.block_tokens, prompt_tokens - 1)  # at least one token is computed

    def _ref(self, chain: Chain) -> None:
        if self._refs[chain] == 0:
            self._lru.pop(chain, None)
        self._refs[chain] += 1

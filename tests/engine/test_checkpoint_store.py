"""The checkpoint store's allocator on small tensors: the memory bound, the victim order, and
guards that are never evicted."""

from __future__ import annotations

import torch
from hypothesis import given, settings, strategies as st

from helios.engine.torch_checkpoints import CheckpointRole, CheckpointStore

LAYERS, HEADS, DIM = 2, 1, 4
PER_TOKEN = 2 * LAYERS * HEADS * DIM * 4  # K and V, float32


def kv(n: int, fill: float = 1.0):
    k = torch.full((LAYERS, HEADS, n, DIM), fill)
    return k, k + 0.5


def test_match_takes_the_longest_shared_prefix_and_guards_it():
    store = CheckpointStore(100 * PER_TOKEN)
    assert store.save([1, 2, 3, 4], *kv(4), CheckpointRole.TERMINAL)
    assert store.save([7, 8], *kv(2), CheckpointRole.TERMINAL)
    m = store.match([1, 2, 3, 9, 9])
    assert m.tokens == 3 and store.guarded() == 1  # a shared prefix of an entry restores exactly
    assert store.match([5, 5]) is None and store.stats.misses == 1
    assert store.match([1, 2, 3, 4]).tokens == 3  # the last prompt token is always prefilled
    k_out, v_out = torch.zeros(LAYERS, HEADS, 8, DIM), torch.zeros(LAYERS, HEADS, 8, DIM)
    store.load(m.entry, m.tokens, k_out, v_out)
    assert torch.equal(k_out[:, :, :3], kv(3)[0]) and torch.equal(v_out[:, :, :3], kv(3)[1])
    assert store.stats.restored_tokens == 3


def test_eviction_order_is_least_recent_demand_first():
    store = CheckpointStore(10 * PER_TOKEN)
    store.save([1] * 4, *kv(4), CheckpointRole.TERMINAL)
    store.save([2] * 4, *kv(4), CheckpointRole.ANCHOR)
    store.release(store.match([1] * 4 + [0]).entry)  # demand for the first entry: it is now recent
    store.save([3] * 4, *kv(4), CheckpointRole.TERMINAL)  # evicts the least recently demanded
    assert store.match([2] * 4 + [0]) is None and store.match([1] * 4 + [0]) is not None
    assert store.stats.evictions == 1


def test_a_guarded_entry_is_never_a_victim():
    store = CheckpointStore(8 * PER_TOKEN)
    store.save([1] * 8, *kv(8), CheckpointRole.TERMINAL)
    m = store.match([1] * 8 + [2])
    assert not store.save([3] * 4, *kv(4), CheckpointRole.TERMINAL)  # no room but the guarded row
    assert store.stats.skipped_snapshots == 1 and len(store) == 1
    store.release(m.entry)
    assert store.save([3] * 4, *kv(4), CheckpointRole.TERMINAL) and store.stats.evictions == 1


def test_an_extension_supersedes_its_prefix_entry():
    store = CheckpointStore(100 * PER_TOKEN)
    store.save([1, 2], *kv(2), CheckpointRole.TERMINAL)
    store.save([1, 2, 3, 4], *kv(4), CheckpointRole.TERMINAL)
    assert len(store) == 1 and store.used_bytes == 4 * PER_TOKEN


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["save", "match", "release"]), st.integers(0, 5), st.integers(1, 9)),
                max_size=40), st.integers(4, 30))
def test_bound_and_guards_hold_under_any_sequence(ops, capacity):
    store = CheckpointStore(capacity * PER_TOKEN)
    held = []
    for op, key, n in ops:
        tokens = [key] * n
        if op == "save":
            guarded = {eid: len(e.tokens) for eid, e in store._entries.items() if e.guards}
            store.save(tokens, *kv(n), CheckpointRole(key % 2))
            for eid in guarded:  # guarded entries survive every save
                assert eid in store._entries
        elif op == "match":
            m = store.match(tokens + [99])
            if m is not None:
                held.append(m.entry)
        elif held:
            store.release(held.pop())
        assert store.used_bytes <= store.capacity_bytes
        assert store.used_bytes == sum(e.nbytes for e in store._entries.values())
    for entry in held:
        store.release(entry)
    assert store.guarded() == 0

"""Anchor cuts on the real model (TorchCore): a nonterminal snapshot publishes a message prefix
as an ANCHOR entry and keeps the slot; a second conversation sharing the first one's system
message restores it while the first is still running, with the same tokens as without
checkpoints."""

from __future__ import annotations

import pytest

from helios.engine.torch_checkpoints import CheckpointRole
from helios.engine.torch_core import TorchCore
from helios.graphs import GraphKind
from helios.runtime.driver import SyncDriver
from helios.scheduler import Scheduler

from tests.engine.test_torch_checkpoints import prompt_of
from tests.engine.torch_helpers import loaded  # noqa: F401  (module fixture)

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
MIB = 1 << 20
# A system message of about 120 tokens: long enough that a cut at its end fits the allowance.
SYSTEM = {"role": "system", "content": "You are a terse assistant. Answer with one short word only. "
          + " ".join(f"Rule {i}: never explain, never apologize, never add a second word." for i in range(8))}


def driver_for(loaded, memory: int):  # noqa: F811
    core = TorchCore(loaded=loaded, request_slots=2, max_context=256, prefill_chunks=(64,), max_batch=2,
                     checkpoint_memory=memory)
    # A high fraction funds every cut on these tiny prompts (the allowance itself is tested on
    # the scheduler); seeded costs make the cut plan independent of this machine's timing.
    sched = Scheduler(core.catalog, config=core.scheduler_config(checkpoint_extra_work_fraction=0.9))
    seeds = {sh: [int(1e6 * (sh.token_capacity / 8 if sh.kind.is_prefill else 0.01 if sh.kind in
                              (GraphKind.SNAPSHOT, GraphKind.RESTORE) else 5))] for sh in core.catalog}
    d = SyncDriver(sched, core)
    sched.seed_costs(seeds, d.now())  # fresh now: a cut whose snapshot cost expired is skipped
    return core, d


def two_conversations(loaded, memory: int):  # noqa: F811
    """A starts; once its system message is stored (with checkpoints), B arrives while A runs."""
    core, d = driver_for(loaded, memory)
    tok = core.tokenizer
    ids_a, ends_a = prompt_of(tok, [SYSTEM, {"role": "user", "content": "Name a color."}])
    ids_b, ends_b = prompt_of(tok, [SYSTEM, {"role": "user", "content": "Name a fruit."}])
    a = d.submit(ids_a, 6, ends_a, temperature=0.0)
    while memory and core.checkpoints.stats.snapshots == 0:
        assert d.step()
    assert d.requests[a].finish is None  # A has no terminal capture yet: B can only use an anchor
    b = d.submit(ids_b, 6, ends_b, temperature=0.0)
    d.run()
    return core, d, (a, b), ends_a


def test_second_conversation_restores_the_system_anchor_with_identical_tokens(loaded):  # noqa: F811
    core, d, (a, b), ends = two_conversations(loaded, 64 * MIB)
    _, plain, (pa, pb), _ = two_conversations(loaded, 0)
    assert d.requests[a].tokens == plain.requests[pa].tokens
    assert d.requests[b].tokens == plain.requests[pb].tokens
    anchors = [p for p in d.history if p.anchor]
    assert anchors and int(anchors[0].lanes.context_tokens[0]) in ends + (len(d.requests[a].prompt),)
    stats = core.checkpoints.stats
    # B restored at least the system message from an anchor entry, and prefilled only the rest.
    assert stats.hits == 1 and stats.restored_tokens >= ends[0]
    b_prefilled = sum(int(n) for p in d.history for h, n in zip(p.lanes.handle, p.lanes.prompt_tokens) if h == b)
    assert b_prefilled == len(d.requests[b].prompt) - stats.restored_tokens
    # Nonterminal snapshots kept A's slot: A's lanes before and after its first cut share it.
    slots_a = {int(s) for p in d.history[1:] for h, s in zip(p.lanes.handle, p.lanes.slot) if h == a}
    assert len(slots_a) == 1
    assert core.checkpoints.guarded() == 0 and not core.requests and sorted(core._free_slots) == [0, 1]


def test_anchor_copy_is_skipped_without_room_and_the_request_continues(loaded):  # noqa: F811
    core, d = driver_for(loaded, 1024)  # far too small for any state copy
    _, plain = driver_for(loaded, 0)
    tok = core.tokenizer
    ids, ends = prompt_of(tok, [SYSTEM, {"role": "user", "content": "Name a color."}])
    h, ph = d.submit(ids, 4, ends, temperature=0.0), plain.submit(ids, 4, ends, temperature=0.0)
    d.run()
    plain.run()
    assert any(p.anchor for p in d.history) and core.checkpoints.stats.skipped_snapshots >= 1
    assert d.requests[h].tokens == plain.requests[ph].tokens
    assert not core.requests and sorted(core._free_slots) == [0, 1]


def test_anchor_entries_carry_the_anchor_role(loaded):  # noqa: F811
    core, d = driver_for(loaded, 64 * MIB)
    ids, ends = prompt_of(core.tokenizer, [SYSTEM, {"role": "user", "content": "Name a color."}])
    d.submit(ids, 2, ends, temperature=0.0)
    while core.checkpoints.stats.snapshots == 0:
        assert d.step()
    roles = {e.role for e in core.checkpoints._entries.values()}
    assert roles == {CheckpointRole.ANCHOR}
    d.run()

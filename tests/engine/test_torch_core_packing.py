"""Input packing of TorchCore's prepared graphs and role validation, without the model."""

from __future__ import annotations

import pytest
import torch

from helios.engine.sampling import SamplingOptions
from helios.engine.torch_graphs import PreparedGraph, RowWork
from helios.engine.torch_packed import PackedGraph
from helios.engine.torch_state import CoreRequest, PlanMismatch, validate_plan
from helios.graphs import Catalog, GraphKind, GraphShape
from helios.scheduler import Lane, ScheduledPlan, SelectionReason

SCRATCH = 9
PREFILL = GraphShape(GraphKind.PREFILL, 4, 64)
DECODE = GraphShape(GraphKind.DECODE, 4)
ROUND = GraphShape(GraphKind.SPECULATIVE, 2, 4, 3, 8)


def test_prefill_packing_offsets_padding_and_masks():
    g = PreparedGraph(PREFILL, SCRATCH)
    rows = [RowWork(3, tuple(range(1, 6)), 0, True),  # a whole 5-token prompt: samples
            RowWork(0, tuple(range(100, 164)), 64, False),  # a full middle chunk: no sample
            RowWork(5, (7, 8, 9), 128, True)]
    p = g.pack(rows)
    assert p.query_lengths == (5, 64, 3)
    assert p.offsets == (0, 5, 69, 72) and p.packed_tokens == 72  # prefix sums, not slot ids
    assert p.slots == (3, 0, 5, SCRATCH)  # lane order; the padding row writes scratch only
    assert p.sample_mask == (True, False, True, False)
    b = g.buffers
    assert b["tokens"][0, :5].tolist() == [1, 2, 3, 4, 5] and b["tokens"][2, :3].tolist() == [7, 8, 9]
    assert b["logits_at"].tolist()[:3] == [4, 63, 2]
    for row, work in zip(b["positions"], rows):
        n = len(work.tokens)
        assert row[:n].tolist() == list(range(work.start, work.start + n))
        tail = row[n:]
        # Padded tail positions are strictly increasing past the real ones.
        assert bool((tail > work.start + n - 1).all()) and bool((tail.diff() > 0).all())
    assert b["slots"][3] == SCRATCH and b["positions"][3].max() < 64


def test_repacking_clears_previous_rows():
    g = PreparedGraph(DECODE, SCRATCH)
    g.pack([RowWork(s, (s + 10,), 40 + s, True) for s in range(4)])
    p = g.pack([RowWork(2, (77,), 12, True)])
    assert p.slots == (2, SCRATCH, SCRATCH, SCRATCH) and p.sample_mask == (True, False, False, False)
    assert g.buffers["tokens"][:, 0].tolist() == [77, 0, 0, 0]
    assert g.buffers["positions"][0, 0] == 12


def test_round_packing_pending_token_then_drafts():
    g = PreparedGraph(ROUND, SCRATCH)
    p = g.pack([RowWork(1, (50, 51, 52, 53), 20, True), RowWork(0, (60,), 7, True)])
    assert p.query_lengths == (4, 1) and p.offsets == (0, 4, 5)
    assert g.buffers["positions"].tolist() == [[20, 21, 22, 23], [7, 8, 9, 10]]
    assert g.buffers["tokens"][1].tolist() == [60, 0, 0, 0]
    with pytest.raises(ValueError):
        g.pack([RowWork(0, (1, 2, 3, 4, 5), 0, True)])
    with pytest.raises(ValueError):
        g.pack([RowWork(0, (1,), 0, True)] * 3)


def test_mixed_packing_lays_several_prompt_rows_by_prefix_sums_within_c():
    """The extension past the spec's one prompt row: R = 2 prompt rows share C = 64, each at its own
    prefix-sum offset with no padding between rows, inside the spec's extent C + (B - 1) W."""
    g = PackedGraph(GraphShape(GraphKind.MIXED, 4, 1, 0, 0, 64, prompt_rows=2), SCRATCH)
    assert g.extent == 64 + 3
    rows = [RowWork(0, (5,), 10, True), RowWork(1, tuple(range(100, 130)), 0, False),
            RowWork(2, tuple(range(200, 234)), 16, True), RowWork(3, (6,), 7, True)]
    p = g.pack(rows, {1, 2})
    assert p.query_lengths == (1, 30, 34, 1) and p.offsets == (0, 1, 31, 65, 66)
    assert p.sample_mask == (True, False, True, True)  # the unfinished prompt chunk samples nothing
    b = g.buffers
    assert b["tokens"][1:31].tolist() == list(range(100, 130)) and b["tokens"][31:65].tolist() == list(range(200, 234))
    assert b["positions"][31:65].tolist() == list(range(16, 50)) and b["positions"][65] == 7
    assert b["logits_at"][:, 0].tolist() == [0, 30, 64, 65]  # each prompt row samples after its last token
    assert b["query_lengths"].tolist() == [1, 30, 34, 1] and b["slots"].tolist() == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="at most 2 prompt rows of 64 tokens together"):
        g.pack([RowWork(s, (1, 2), 0, True) for s in range(3)], {0, 1, 2})
    with pytest.raises(ValueError, match="at most 2 prompt rows of 64 tokens together"):
        g.pack([RowWork(0, tuple(range(30)), 0, True), RowWork(1, tuple(range(35)), 0, True)], {0, 1})


def request(handle, prompt_len, kv_len=0, generated=(), slot=None):
    opts = SamplingOptions()
    return CoreRequest(handle, tuple(range(prompt_len)), opts, opts.generator(), slot, None, kv_len,
                       list(generated))


def plan(shape, *lanes, device=False):
    return ScheduledPlan(shape, lanes, 1, 0.0, 0.0, SelectionReason.ORDINARY, False, False, 0, 0, (),
                         device)


def lane(handle, slot, start=0, prompt=0, context=0, rows=1):
    return Lane(handle, 0, 0, slot, start, prompt, context, rows, 1.0, 1.0, 0.0)


def test_validation_binds_free_slots_and_checks_roles():
    catalog = Catalog([PREFILL, DECODE, ROUND])
    reqs = {0: request(0, 100), 1: request(1, 10, kv_len=10, generated=[5], slot=2),
            2: request(2, 30, kv_len=30, generated=[6, 7], slot=3)}
    reqs[2].kv_len = 31
    works = validate_plan(plan(PREFILL, lane(0, None, 0, 64, 0, 0)), reqs, [1, 0], catalog, 256)
    assert [(w.slot, w.new_slot, w.finishes_prompt) for w in works] == [(0, True, False)]
    works = validate_plan(plan(DECODE, lane(1, 4, 10, 0, 11), lane(2, 5, 30, 0, 32)), reqs, [], catalog, 256)
    assert [w.slot for w in works] == [2, 3]
    # A round queued behind another plans with the earlier ceiling: an upper bound is fine.
    validate_plan(plan(ROUND, lane(1, 4, 10, 0, 14, rows=4)), reqs, [], catalog, 256)

    def bad(p, match, free=(1, 0), max_context=256):
        with pytest.raises(PlanMismatch, match=match):
            validate_plan(p, reqs, list(free), catalog, max_context)

    bad(plan(DECODE, lane(3, 0, 0, 0, 1)), "not attached")
    bad(plan(DECODE, lane(1, 4, 10, 0, 11), lane(1, 4, 10, 0, 11)), "twice")
    bad(plan(PREFILL, lane(0, None, 64, 64, 64, 0)), "prompt offset 64")
    # Rows are packed by prefix sums: one row may exceed C (64) but not the graph's B x C (256).
    bad(plan(PREFILL, lane(0, None, 0, 257, 0, 0)), "packed capacity 256")
    bad(plan(PREFILL, lane(0, None, 0, 64, 0, 0)), "no free KV slot", free=())
    bad(plan(DECODE, lane(1, None, 10, 0, 11)), "slot None on a resident")
    bad(plan(ROUND, lane(1, 4, 10, 0, 11, rows=5)), "5 output rows in a graph of width 4")
    bad(plan(ROUND, lane(1, 4, 10, 0, 10, rows=2)), "lane context 10")
    bad(plan(ROUND, lane(1, 4, 10, 0, 11, rows=4)), "exceed context 12", max_context=12)
    bad(plan(ROUND, lane(1, 4, 10, 0, 11, rows=2), device=True), "host only")
    bad(plan(DECODE, lane(1, 4, 10, 3, 11)), "prompt tokens in a decode graph")
    bad(plan(GraphShape(GraphKind.DECODE, 8), lane(1, 4, 10, 0, 11)), "not a prepared graph")
    reqs[1].scheduler_slot = 4
    bad(plan(DECODE, lane(1, 6, 10, 0, 11)), "scheduler slot 4")
    assert reqs[0].slot is None and reqs[0].kv_len == 0  # validation never mutates


def test_graph_buffers_are_static():
    g = PreparedGraph(PREFILL, SCRATCH)
    ptrs = {k: v.data_ptr() for k, v in g.buffers.items()}
    g.pack([RowWork(0, (1, 2), 0, True)])
    g.pack([RowWork(1, tuple(range(64)), 0, False)] * 4)
    assert {k: v.data_ptr() for k, v in g.buffers.items()} == ptrs
    assert g.buffers["tokens"].shape == (4, 64) and g.buffers["tokens"].dtype == torch.long


def test_eager_forward_runs_only_active_rows_and_their_longest_query():
    g = PreparedGraph(PREFILL, SCRATCH)
    assert g.active == (4, 64)  # nothing packed yet: the whole grid
    g.pack([RowWork(3, (1, 2, 3), 40, True), RowWork(0, tuple(range(9)), 0, False)])
    assert g.active == (2, 16)  # two rows; 9 queries rounded up to the quantum (8)
    g.pack([RowWork(1, tuple(range(60)), 0, True)])
    assert g.active == (1, 64)  # rounding never passes the graph's length
    g.pack([RowWork(s, tuple(range(64)), 0, False) for s in range(4)])
    assert g.active == (4, 64)  # a full grid runs whole (the warm-up times these)
    d = PreparedGraph(DECODE, SCRATCH)
    d.pack([RowWork(2, (77,), 12, True)])
    assert d.active == (1, 1)

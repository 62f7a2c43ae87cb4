"""flare_checkpoint_* metrics: the store's counters and the scheduler's snapshot/restore runs."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from helios.engine.torch_checkpoints import CheckpointRole, CheckpointStore
from helios.graphs import GraphKind, GraphShape
from helios.server.metrics import _checkpoint_metrics


def values(families) -> dict:
    return {s.name: s.value for f in families for s in f.samples}


def test_checkpoint_metrics_report_store_counters_and_state_executions():
    store = CheckpointStore(1 << 20)
    k = torch.zeros(1, 1, 4, 2)
    store.save([1, 2, 3, 4], k, k, CheckpointRole.TERMINAL)
    store.release(store.match([1, 2, 3, 9]).entry)
    store.match([7, 7])
    snap = SimpleNamespace(by_shape={GraphShape(GraphKind.SNAPSHOT, 1): 3, GraphShape(GraphKind.RESTORE, 1): 2,
                                     GraphShape(GraphKind.DECODE, 1): 9})
    got = values(_checkpoint_metrics(snap, store))
    assert got["flare_checkpoint_hits_total"] == 1 and got["flare_checkpoint_misses_total"] == 1
    assert got["flare_checkpoint_snapshot_executions_total"] == 3
    assert got["flare_checkpoint_restore_executions_total"] == 2
    assert got["flare_checkpoint_bytes"] == store.used_bytes > 0
    # Without a store (the sim engine, a baseline) the counters exist and read zero.
    none = values(_checkpoint_metrics(SimpleNamespace(by_shape={}), None))
    assert none["flare_checkpoint_hits_total"] == 0 and "flare_checkpoint_bytes" not in none

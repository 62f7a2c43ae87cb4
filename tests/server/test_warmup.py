"""The startup warm-up (helios.server.warmup) and the default sizing (helios.server.sizing).

Rules tested:
- the warm-up discards each graph's first run and seeds every measured sample through the
  protocol's seed_costs, touching no request slot;
- seeded estimates are within a sane factor of a later steady-state sample of the same graph;
- with the seeded costs, four ready decoders with equal prices are worth most as one B=4
  decode, also when the warm-up ran while another process kept both cores busy;
- default slots and context come from the machine's memory and the model's KV size.
"""

from __future__ import annotations

import multiprocessing
import statistics

import pytest
import torch

from helios.config import PolicyConfig
from helios.engine.model import load_config
from helios.engine.torch_core import TorchCore, load_model
from helios.graphs import GraphKind, GraphShape
from helios.scheduler import Scheduler
from helios.server.sizing import CONTEXT_CAP, MAX_SLOTS, choose_capacity, kv_bytes_per_token, weight_bytes
from helios.server.warmup import WarmupConfig, measure, warm_up

GIB = 1024 ** 3


@pytest.fixture(scope="module")
def loaded():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the engine tests: two threads crawl on a loaded 2-core box
    yield load_model()
    torch.set_num_threads(threads)


def core_for(loaded, chunks=(64,)):
    return TorchCore(loaded=loaded, request_slots=4, max_batch=4, max_context=512, prefill_chunks=chunks)


class CountingCore:
    """Records which graphs a warm-up ran (no model needed)."""

    def __init__(self, catalog):
        self.catalog = catalog
        self.calls: list[GraphShape] = []

    def time_graph(self, shape, context=0):
        self.calls.append(shape)
        return 1_000_000 * shape.batch_capacity * shape.token_capacity


def test_warmup_discards_first_runs_rotates_rounds_and_keeps_to_its_budget():
    from helios.prepare import ordinary_catalog

    core = CountingCore(ordinary_catalog(4, (64,)))
    report = measure(core, WarmupConfig(discard=1, rounds=3))
    shapes = list(core.catalog)
    assert core.calls[:len(shapes)] == shapes  # the discarded first runs
    rounds = core.calls[len(shapes):]
    assert len(rounds) == 3 * len(shapes)
    assert rounds[len(shapes)] == shapes[1]  # round 2 starts one graph later
    assert all(len(v) == 3 for v in report.samples.values())
    core.calls.clear()
    short = measure(core, WarmupConfig(discard=0, rounds=3, budget_s=0.0))  # past budget after one round
    assert len(core.calls) == len(shapes) and all(len(v) == 1 for v in short.samples.values())


def test_seed_costs_receives_every_sample(loaded):
    class Recorder:
        def seed_costs(self, samples, now_ns):
            self.samples = {s: list(v) for s, v in samples.items()}

    core = core_for(loaded)
    core.cache.k[:, :4] = 3.0
    rec = Recorder()
    report = warm_up(rec, core, WarmupConfig(discard=1, rounds=2))
    assert set(rec.samples) == set(core.catalog) and all(len(v) == 2 for v in rec.samples.values())
    assert bool((core.cache.k[:, :4] == 3.0).all())  # only the scratch slot was written
    assert report.elapsed_s > 0


def test_seeded_estimates_are_near_steady_state(loaded):
    core = core_for(loaded)
    scheduler = Scheduler(core.catalog, PolicyConfig(), core.scheduler_config())
    warm_up(scheduler, core)
    seeded = scheduler.snapshot().estimates_ns
    assert set(seeded) == set(core.catalog)
    for shape in (GraphShape(GraphKind.DECODE, 1), GraphShape(GraphKind.DECODE, 4),
                  GraphShape(GraphKind.PREFILL, 1, 64)):
        steady = statistics.median(core.time_graph(shape, 256 if shape.kind is GraphKind.DECODE else 0)
                                   for _ in range(3))
        # A sane factor, not a benchmark: one-off first-run or contention costs were 10-30x.
        assert steady / 4 <= seeded[shape] <= steady * 4, (shape.label(), seeded[shape], steady)


def _burn(stop):
    x = 0
    while not stop.is_set():
        x += 1


@pytest.mark.parametrize("burner", [False, True], ids=["quiet", "cores-busy"])
def test_seeded_costs_make_b4_the_choice_for_four_ready_decoders(loaded, burner):
    """With the seeded costs, four decoders with equal prices are worth most as one decode[B=4]:
    4 tokens per est(B=4) beats 2 per est(B=2) and 1 per est(B=1). A one-sample warm-up taken
    while the cores were busy recorded decode[B=4] at 1.66 s against ~60 ms for B=1, and every
    decode then ran at B=1. The burner holds both cores for the whole warm-up."""
    core = core_for(loaded)
    stop = multiprocessing.Event()
    procs = [multiprocessing.Process(target=_burn, args=(stop,)) for _ in range(2 if burner else 0)]
    for p in procs:
        p.start()
    try:
        scheduler = Scheduler(core.catalog, PolicyConfig(), core.scheduler_config())
        report = warm_up(scheduler, core)
    finally:
        stop.set()
        for p in procs:
            p.join()
    est = scheduler.snapshot().estimates_ns
    b1, b2, b4 = (est[GraphShape(GraphKind.DECODE, b)] for b in (1, 2, 4))
    assert b4 < 2 * b2 and b4 < 4 * b1, report.describe()


def test_default_capacity_fits_memory_and_model():
    c = load_config()
    per_token = kv_bytes_per_token(c.n_layers, c.n_kv_heads, c.head_dim)
    assert per_token == 2 * 30 * 3 * 64 * 4  # SmolLM2: 46 KB per token and slot
    big = choose_capacity(c, slots=None, max_context=None, memory_bytes=256 * GIB)
    assert (big.slots, big.max_context) == (MAX_SLOTS, min(c.max_context, CONTEXT_CAP))
    small = choose_capacity(c, slots=None, max_context=None, memory_bytes=4 * GIB)
    assert small.kv_bytes <= 0.4 * (4 * GIB - weight_bytes(c))
    assert small.slots & (small.slots - 1) == 0 and small.slots >= 1  # a power of two
    assert choose_capacity(c, slots=3, max_context=512, memory_bytes=GIB).slots == 3
    assert "auto" in small.describe() and "GiB" in small.describe()

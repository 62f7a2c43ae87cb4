"""No hidden globals in the pure core: deciding leaves every module-level container of
helios.scheduler as it was; the scheduler's caches live on the instance (Scheduler.memo)."""

from __future__ import annotations

import importlib
import itertools
import pkgutil

import helios.scheduler
from helios.config import SchedulerConfig, SpeculationMode
from helios.engine.sim_core import SimCore
from helios.prepare import Capacities, build_catalog
from helios.runtime.driver import SyncDriver
from helios.scheduler import Scheduler
from helios.sim.synthetic_cost import SyntheticCostModel

from conftest import MS


def _module_containers() -> dict[str, int]:
    """Every dict, list and set bound at module level in helios.scheduler.*, by name: its size."""
    sizes = {}
    for info in pkgutil.iter_modules(helios.scheduler.__path__):
        module = importlib.import_module(f"helios.scheduler.{info.name}")
        for name, value in vars(module).items():
            if type(value) in (dict, list, set):
                sizes[f"{info.name}.{name}"] = len(value)
    return sizes


def _run(s: Scheduler) -> None:
    """Speculative, mixed, prefill and decode decisions over SimCore to the end."""
    cost = SyntheticCostModel.realistic_small()
    s.seed_costs({shape: [cost.duration_ns(shape, [64])] for shape in s.catalog}, 0)
    clock = itertools.count(0, MS)
    d = SyncDriver(s, SimCore(s.catalog, cost, seed=0, request_slots=8), clock=lambda: next(clock))
    for prompt in (40, 300, 700, 64):
        d.submit(range(prompt), 6)
    d.run()


def test_deciding_leaves_module_level_state_alone_and_memos_are_per_scheduler():
    catalog = build_catalog(Capacities(8, (64, 256), speculation=SpeculationMode.ADAPTIVE, widths=(1, 2, 4),
                                       speculative_token_capacity=32, mixed_prefill=True))
    before = _module_containers()
    a = Scheduler(catalog, config=SchedulerConfig(request_slots=8, speculation=SpeculationMode.ADAPTIVE))
    _run(a)
    assert _module_containers() == before
    assert a.memo.keys and a.memo.cohorts and a.memo.decay  # the caches filled on the instance
    b = Scheduler(catalog, config=SchedulerConfig(request_slots=8))
    assert b.memo is not a.memo and not b.memo.keys

"""Rule (DESIGN.md §3): every scheduler implements the one narrow protocol, and its
liveness, snapshot and warm-up seeding agree with what the spec's API did."""

from __future__ import annotations

import pytest

from helios.baselines import make_scheduler
from helios.config import SchedulerConfig
from helios.errors import HeliosError
from helios.graphs import GraphKind, GraphShape
from helios.scheduler.request_spec import RequestSpec
from helios.scheduler.protocol import SchedulerProtocol

from .support import ALL, CATALOG


@pytest.mark.parametrize("name", ALL)
def test_every_scheduler_implements_the_protocol(name):
    sched = make_scheduler(name, CATALOG, None, SchedulerConfig(request_slots=8))
    assert isinstance(sched, SchedulerProtocol)


@pytest.mark.parametrize("name", ALL)
def test_snapshot_liveness_and_seeding(name):
    sched = make_scheduler(name, CATALOG, None, SchedulerConfig(request_slots=8))
    h = sched.admit(RequestSpec(prompt_tokens=16, max_output_tokens=4), 0)
    assert sched.is_live(h) and not sched.is_live(h + 1)
    snap = sched.snapshot()
    assert (snap.live, snap.running, snap.waiting) == (1, 0, 1)
    assert snap.free_slots == snap.total_slots == 8 and snap.queued_frames == 0
    decode = next(s for s in CATALOG if s.kind is GraphKind.DECODE)
    sched.seed_costs({decode: [5_000_000, 7_000_000, 6_000_000]}, 10)
    estimate = sched.snapshot().estimates_ns[decode]
    # Helios keeps the median of the samples; direct keeps its 7/8 moving average.
    assert estimate == (5_343_750 if name == "direct" else 6_000_000)
    with pytest.raises(HeliosError):
        sched.seed_costs({GraphShape(GraphKind.DECODE, 4096): [1]}, 10)
    sched.cancel(h, 20)
    assert not sched.is_live(h) and sched.snapshot().live == 0

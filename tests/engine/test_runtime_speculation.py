"""The runtime drives device-allocated speculative rounds through complete_packed_round."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from helios.config import SchedulerConfig, SpeculationMode  # noqa: E402
from helios.runtime.runtime import Runtime  # noqa: E402
from helios.engine.sim_core import SimCore  # noqa: E402
from helios.graphs import Catalog, GraphKind, GraphShape  # noqa: E402
from helios.prepare import speculative_shapes  # noqa: E402
from helios.scheduler import Scheduler  # noqa: E402
from helios.sim.acceptance import AcceptanceModel  # noqa: E402


class Costs:
    def duration_ns(self, shape, context_lens) -> int:
        return int((1 + 0.02 * shape.target_capacity) * 1e6)


@pytest.mark.timeout(60)
def test_adaptive_rounds_complete_with_their_confidence_sidecar():
    shapes = speculative_shapes(4, range(1, 6), 8) + [GraphShape(GraphKind.PREFILL, b, 64) for b in (1, 2, 4)]
    catalog = Catalog(shapes)
    config = SchedulerConfig(request_slots=4, kv_pages=512, speculation=SpeculationMode.ADAPTIVE)
    scheduler = Scheduler(catalog, config=config)
    core = SimCore(catalog, Costs(), acceptance=AcceptanceModel(seed=3), request_slots=4,
                   draft_capacity=config.draft_capacity)
    with Runtime(scheduler, core) as runtime:
        streams = [runtime.submit(list(range(1, 40)), max_tokens=30) for _ in range(4)]
        for s in streams:
            assert s.wait(30)
    assert [s.finish_reason for s in streams] == ["length"] * 4
    assert all(s.usage.completion_tokens == 30 for s in streams)
    assert scheduler.stats.speculative_programs > 0
    assert any(sh.target_capacity < sh.batch_capacity * sh.token_capacity for sh in scheduler.stats.by_shape)
    assert scheduler.resources.free_slots == 4

"""The class gap bound (StudyConfig.class_gap_bound, outside the spec, off by default;
docs/scheduling-utility.md, "The class gap bound"): a prompt-bearing candidate is dropped when some
decoder's age + T + the fastest decode step would pass its own bound, a fraction of the gap target its
service class states. Decoders of classes that state none are unbounded (or keep stall_bound_ms)."""

from __future__ import annotations

import numpy as np
import pytest

from helios.config import StudyConfig, preset
from helios.errors import ConfigError
from helios.scheduler.class_prices import class_prices
from helios.scheduler.service_class import ServiceClass

from conftest import MS, Driver, FixedCosts, configs, decode, make, prefill, spec

# Chunks of 25 and 80 ms among 10-15 ms decode steps (test_normalizers.py's stall table).
TABLE = {decode(1): 10.0, decode(2): 11.0, decode(4): 12.0, decode(8): 13.0, decode(16): 15.0,
         prefill(64): 10.0, prefill(256): 25.0, prefill(1024): 80.0}
TIGHT = ServiceClass("tight", gap_ms=100.0)  # 0.6 of it: a 60-ms bound
LOOSE = ServiceClass("loose", ttft_ms=10_000.0)  # states no gap target


def run(policy, decoder_classes):
    """Decoders of `decoder_classes` stream; a 4,000-token prompt arrives. Returns whether its first
    token came out, the chunk sizes it ran in, and each decoder's longest gap in ms."""
    s = make(TABLE, policy=policy)
    hs = [s.admit(spec(prompt=64, out=1000, service_class=c), 0) for c in decoder_classes]
    d = Driver(s, FixedCosts(TABLE))
    for _ in range(12):
        d.run_one()
    prompt = s.admit(spec(prompt=4000, out=8), s.now_ns)
    chunks = [p.shape.token_capacity for p in (d.run_one() for _ in range(80)) if p.shape.kind.is_prefill]
    gaps = [np.diff(d.published[h]).max() / MS for h in hs]
    return prompt in d.published, chunks, gaps


def test_a_decoder_whose_class_states_a_gap_target_bounds_the_chunks_around_it():
    bounded = configs(class_gap_bound=0.6, stall_pricing=False)
    served, chunks, gaps = run(bounded, [TIGHT] * 4)
    # age + T + the fastest (10-ms) decode step <= 60 ms: no 80-ms chunk while a tight decoder waits.
    assert served and chunks and 1024 not in chunks and max(gaps) < 80.0
    # The same decoders without the bound: the 80-ms chunk runs and some gap passes 80 ms.
    served, chunks, gaps = run(configs(stall_pricing=False), [TIGHT] * 4)
    assert served and 1024 in chunks and max(gaps) >= 80.0


def test_decoders_without_a_stated_gap_target_are_not_bounded():
    loose = [LOOSE] * 4
    assert run(configs(class_gap_bound=0.6, stall_pricing=False), loose) == run(configs(stall_pricing=False), loose)


def test_the_tightest_decoder_binds_and_stall_bound_ms_still_binds_the_others():
    served, chunks, gaps = run(configs(class_gap_bound=0.6, stall_pricing=False), [LOOSE, LOOSE, LOOSE, TIGHT])
    assert served and 1024 not in chunks and gaps[-1] < 80.0
    # With the scalar bound too, the loose decoders are held to it (and the tight one to the lower of the two).
    served, chunks, gaps = run(configs(class_gap_bound=1.0, stall_bound_ms=60.0, stall_pricing=False), [LOOSE] * 4)
    assert served and 1024 not in chunks and max(gaps) < 80.0


def test_only_a_stated_gap_target_is_carried():
    # A deadline-only class implies a gap (half its deadline over its output) for its prices, but the bound
    # reads only what a class states: an implied 23-ms "gap" would hold every prompt behind batch decoders.
    policy = preset("balanced")
    batch = class_prices(ServiceClass("batch", deadline_ms=92_000.0), policy, 100, 2000)
    assert batch.gap_target_ms is None and batch.stream_tau_ms < policy.adaptation_ms
    assert class_prices(TIGHT, policy, 100, 2000).gap_target_ms == 100.0


@pytest.mark.parametrize("bad", [0, 0.0, -0.5, 1.5, True, "0.9", float("nan")])
def test_the_bound_is_a_fraction_of_the_target(bad):
    with pytest.raises(ConfigError, match="class_gap_bound"):
        StudyConfig(class_gap_bound=bad)

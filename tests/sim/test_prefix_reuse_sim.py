"""Prefix reuse in simulated runs: nothing lost, exactly the cached blocks skipped, the same memory for
every scheduler, and reuse off (or nothing to reuse) bit-for-bit unchanged."""

from __future__ import annotations

import dataclasses

import pytest

from helios.engine.sim_core import SimCore
from helios.sim.experiment import Setup, default_slo, prefix_cache_for, run_workload, split_reuse
from helios.sim.traces import TraceRequest
from helios.sim.workload import load_workload

SETUP = Setup(request_slots=16)
WINDOW = 9.0  # seconds of the Mooncake trace: 28 requests, several sharing their first blocks
NS = 1_000_000_000


def _mooncake():
    return load_workload("mooncake", WINDOW)


def _run(name: str, requests, setup: Setup = SETUP, seed: int = 0):
    return run_workload(name, requests, setup, seed=seed, slo=default_slo(requests, setup), progress=False)


def _per_request(result):
    """Every request's client-visible history, in arrival order."""
    logs = sorted(result.sim.logs.values(), key=lambda log: log.arrival_ns)
    return [(log.arrival_ns, tuple(log.publications), log.finish, log.finished_ns) for log in logs]


@pytest.mark.parametrize("name", ["vllm-fcfs", "sarathi", "helios-balanced"])
def test_reuse_loses_nothing_and_skips_exactly_the_cached_blocks(name, monkeypatch):
    base = _mooncake()
    off = _run(name, base)
    firsts: dict[int, int] = {}  # handle -> where its first prefill lane started
    execute = SimCore.execute

    def spy(core, plan, fence):
        for lane in plan.lanes:
            if lane.prompt_tokens:
                firsts.setdefault(int(lane.handle), int(lane.prompt_start))
        return execute(core, plan, fence)

    monkeypatch.setattr(SimCore, "execute", spy)
    on = _run(name + "+reuse", base)
    logs_on = sorted(on.sim.logs.values(), key=lambda log: log.arrival_ns)
    logs_off = sorted(off.sim.logs.values(), key=lambda log: log.arrival_ns)
    assert len(logs_on) == len(base) == on.metrics.finished
    assert any(log.cached_tokens for log in logs_on)  # the window does reuse prefixes
    for req, a, b in zip(base, logs_off, logs_on):
        assert a.output_tokens == b.output_tokens == req.output_tokens and a.finish == b.finish
        assert b.prompt_tokens == req.prompt_tokens
        # A hit is whole 512-token blocks (one token less when it covers the prompt), and prefill
        # computes exactly the rest.
        assert b.cached_tokens % 512 == 0 or b.cached_tokens == req.prompt_tokens - 1
        assert sum(n for _, n in b.prefills) == req.prompt_tokens - b.cached_tokens
    saved = sum(log.cached_tokens for log in logs_on) / sum(r.prompt_tokens for r in base)
    assert on.metrics.prefill_saved == pytest.approx(saved) and off.metrics.prefill_saved == 0
    # The first prefill lane of a request with a hit starts right after the cached prefix.
    assert {h: log.cached_tokens for h, log in on.sim.logs.items()} == firsts


def test_a_hit_needs_a_cached_chain_from_the_first_block():
    # Three identical prompts far apart in time; the third's head differs, so only the second hits.
    blocks = (101, 102, 103)
    reqs = [TraceRequest(0, 3 * 512 + 7, 4, prefix_blocks=blocks),
            TraceRequest(20 * NS, 3 * 512 + 7, 4, prefix_blocks=blocks),
            TraceRequest(40 * NS, 3 * 512 + 7, 4, prefix_blocks=(999, 102, 103))]
    r = _run("vllm-fcfs+reuse", reqs)
    assert [log.cached_tokens for log in sorted(r.sim.logs.values(), key=lambda x: x.arrival_ns)] == [0, 1536, 0]


def test_every_scheduler_gets_the_same_memory_and_the_cache_stays_within_it():
    base = _mooncake()
    caches = []
    for name in ("helios-balanced", "vllm-fcfs", "sarathi"):
        r = _run(name + "+reuse", base)
        pool, cache = r.sim.scheduler.snapshot(), r.sim.prefix_cache
        caches.append((pool.total_pages, cache.page_tokens, cache.block_tokens, cache.capacity_blocks))
        # After the run nothing is referenced, and the unreferenced blocks fit the free pages.
        assert cache.unreferenced_count == len(cache.unreferenced()) == len(cache) > 0
        assert len(cache) * 512 <= pool.free_pages * cache.page_tokens
    assert len(set(caches)) == 1 and caches[0][:2] == (SETUP.config().kv_pages, SETUP.page_tokens)
    a = prefix_cache_for(SETUP, "helios-balanced+reuse")
    b = prefix_cache_for(SETUP, "vllm-fcfs+reuse")
    assert (a.block_tokens, a.capacity_blocks) == (b.block_tokens, b.capacity_blocks) == (512, None)
    assert prefix_cache_for(SETUP, "vllm-fcfs") is None and split_reuse("sarathi+reuse") == ("sarathi", True)


def test_a_small_cache_evicts_and_still_serves_everything():
    # Three distinct 4-block prompts, each asked twice, far enough apart that no two overlap.
    prompts = [(1, 2, 3, 4), (5, 6, 7, 8), (9, 10, 11, 12)] * 2
    reqs = [TraceRequest(30 * NS * i, 4 * 512 + 7, 3, prefix_blocks=b) for i, b in enumerate(prompts)]
    big = _run("vllm-fcfs+reuse", reqs)
    small = _run("vllm-fcfs+reuse", reqs, dataclasses.replace(SETUP, prefix_cache_tokens=4 * 512))
    cached = lambda r: [log.cached_tokens for log in sorted(r.sim.logs.values(), key=lambda x: x.arrival_ns)]
    assert cached(big) == [0, 0, 0, 2048, 2048, 2048] and big.sim.prefix_cache.stats().evicted_blocks == 0
    # Room for one prompt: each new prompt evicts the previous one, so nothing is ever hit.
    assert cached(small) == [0] * 6 and small.sim.prefix_cache.stats().evicted_blocks == 20
    assert small.metrics.finished == big.metrics.finished == 6 and len(small.sim.prefix_cache) == 4


@pytest.mark.parametrize("name", ["helios-balanced", "vllm-fcfs"])
def test_nothing_to_reuse_is_bit_for_bit_the_run_without_reuse(name):
    # The cache machinery itself changes no time: without block hashes nothing can hit.
    plain = [dataclasses.replace(r, prefix_blocks=()) for r in _mooncake()]
    off, on = _run(name, plain, seed=3), _run(name + "+reuse", plain, seed=3)
    assert _per_request(off) == _per_request(on)
    assert off.metrics == on.metrics
    # And reuse off ignores the hashes entirely.
    assert _per_request(_run(name, _mooncake(), seed=3)) == _per_request(off)

"""Workload loaders: row counts, windows, rate scaling, determinism, burstiness."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from helios.sim import traces as T
from helios.sim.traces import TraceRequest


@pytest.fixture(scope="module")
def azure() -> list[TraceRequest]:
    return T.load_azure_conv()


@pytest.fixture(scope="module")
def mooncake() -> list[TraceRequest]:
    return T.load_mooncake()


def _valid(reqs: list[TraceRequest], max_context: int = T.DEFAULT_MAX_CONTEXT) -> None:
    arrivals = [r.arrival_ns for r in reqs]
    assert arrivals == sorted(arrivals) and arrivals[0] >= 0
    assert all(r.prompt_tokens >= 1 and r.output_tokens >= 1 for r in reqs)
    assert all(r.prompt_tokens + r.output_tokens <= max_context for r in reqs)
    assert all(isinstance(r.arrival_ns, int) for r in reqs)


def test_trace_request_is_frozen():
    r = TraceRequest(0, 10, 5)
    assert r.client == "default" and r.prefix_blocks == ()
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.prompt_tokens = 3  # type: ignore[misc]


def test_default_data_dir_and_missing_dir(tmp_path):
    assert (T.default_data_dir() / T.AZURE_CONV).is_file()
    with pytest.raises(FileNotFoundError, match="data folder not found"):
        T.default_data_dir(tmp_path)


def test_azure_full_trace(azure):
    assert len(azure) == 19366
    assert azure[0].arrival_ns == 0
    assert 3400 < azure[-1].arrival_ns / 1e9 < 3600  # 58 minutes
    assert (azure[0].prompt_tokens, azure[0].output_tokens) == (374, 44)
    _valid(azure)
    assert 0.8 < T.interarrival_cv2(azure) < 1.5  # near-Poisson, per PROVENANCE


def test_mooncake_full_trace(mooncake):
    assert len(mooncake) == 12031
    first = mooncake[0]
    assert first.prefix_blocks == tuple(range(14)) and first.prompt_tokens == 6758
    _valid(mooncake)
    assert T.interarrival_cv2(mooncake) > 2  # bursty
    # Clipped prompts keep only the hash blocks they still cover.
    assert all(len(r.prefix_blocks) <= -(-r.prompt_tokens // T.MOONCAKE_BLOCK_TOKENS) for r in mooncake)


def test_mooncake_max_context_keeps_outputs():
    wide = T.load_mooncake(max_context=200_000, limit=500)
    narrow = T.load_mooncake(max_context=4096, limit=500)
    _valid(narrow, 4096)
    assert [r.output_tokens for r in wide] == [r.output_tokens for r in narrow]
    assert max(r.prompt_tokens for r in wide) > 4096


@pytest.mark.parametrize("loader", [T.load_azure_conv, T.load_mooncake])
def test_window_and_rate_scaling(loader):
    base = loader(start_s=600, duration_s=120)
    assert base and base[0].arrival_ns >= 0 and base[-1].arrival_ns < 120e9
    fast = loader(start_s=600, duration_s=120, rate_scale=4.0)
    assert len(fast) == len(base)
    assert [(r.prompt_tokens, r.output_tokens) for r in fast] == [(r.prompt_tokens, r.output_tokens) for r in base]
    for a, b in zip(base, fast):
        assert abs(a.arrival_ns / 4 - b.arrival_ns) <= 1
    limited = loader(start_s=600, duration_s=120, limit=7)
    assert limited == base[:7]
    with pytest.raises(ValueError):
        loader(rate_scale=0)


def test_clip_lengths():
    assert T.clip_lengths(0, 0, 100) == (1, 1)
    assert T.clip_lengths(50, 30, 100) == (50, 30)
    assert T.clip_lengths(500, 30, 100) == (70, 30)
    assert T.clip_lengths(5, 500, 100) == (1, 99)


def test_sharegpt_poisson_determinism_and_rate():
    a = T.sharegpt_poisson(10.0, 3000, seed=7)
    assert a == T.sharegpt_poisson(10.0, 3000, seed=7)
    assert a != T.sharegpt_poisson(10.0, 3000, seed=8)
    assert len(a) == 3000
    _valid(a)
    mean_gap_s = a[-1].arrival_ns / 1e9 / len(a)
    assert mean_gap_s == pytest.approx(0.1, rel=0.08)
    lengths = T.load_sharegpt_lengths()
    assert lengths.shape == (10000, 2)


def test_burstiness_changes_cv():
    poisson = T.interarrival_cv2(T.sharegpt_poisson(5.0, 4000, seed=1))
    bursty = T.interarrival_cv2(T.sharegpt_poisson(5.0, 4000, seed=1, burstiness=4.0))
    smooth = T.interarrival_cv2(T.sharegpt_poisson(5.0, 4000, seed=1, burstiness=0.25))
    assert poisson == pytest.approx(1.0, abs=0.15)
    assert bursty == pytest.approx(4.0, rel=0.3)
    assert smooth == pytest.approx(0.25, rel=0.2)


def test_multi_client_fairness_mix():
    reqs = T.multi_client(duration_s=120, seed=3)
    assert reqs == T.multi_client(duration_s=120, seed=3)
    _valid(reqs)
    assert reqs[-1].arrival_ns < 120e9
    by = {c.name: [r for r in reqs if r.client == c.name] for c in T.DEFAULT_CLIENTS}
    assert by["heavy"] and all(by[n] for n in ("light-1", "light-2", "light-3"))
    assert len(by["heavy"]) > 2.5 * len(by["light-1"])
    heavy_prompt = np.mean([r.prompt_tokens for r in by["heavy"]])
    light_prompt = np.mean([r.prompt_tokens for r in by["light-1"] + by["light-2"] + by["light-3"]])
    assert heavy_prompt > 2 * light_prompt


def test_multi_client_streams_are_independent():
    clients = [T.ClientSpec("a", 2.0), T.ClientSpec("b", 2.0, burstiness=3.0)]
    one = [r for r in T.multi_client(clients[:1], duration_s=60, seed=5)]
    two = [r for r in T.multi_client(clients, duration_s=60, seed=5) if r.client == "a"]
    assert one == two
    with pytest.raises(ValueError):
        T.multi_client([T.ClientSpec("a", 1.0), T.ClientSpec("a", 2.0)])

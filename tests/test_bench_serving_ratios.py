"""bench/serving.py --repeats: per-pair flare/peer ratios and their range."""

import importlib.util
import pathlib
import sys

spec = importlib.util.spec_from_file_location(
    "bench_serving", pathlib.Path(__file__).resolve().parents[1] / "bench/serving.py")
serving = importlib.util.module_from_spec(spec)
sys.modules["bench_serving"] = serving  # dataclasses look their module up there
spec.loader.exec_module(serving)


def result(tokens, wall, ttft, short=()):
    return serving.Result(list(ttft), list(short), tokens, wall)


def test_spread_gives_the_median_and_the_range():
    assert serving.spread([1.0]) == "1.00x"
    assert serving.spread([0.9, 1.2, 1.0]) == "1.00x (0.90-1.20x)"
    assert serving.spread([0.5, 1.5]) == "1.00x (0.50-1.50x)"


def test_ratios_pair_the_ith_run_of_each_server():
    # Pair 1: flare 200 tok/s vs peer 100; pair 2: 150 vs 150. TTFTs: flare half, then equal.
    flare = [result(200, 1.0, [0.5], [0.5]), result(300, 2.0, [1.0], [2.0])]
    peer = [result(100, 1.0, [1.0], [1.0]), result(150, 1.0, [1.0], [1.0])]
    cells = serving.ratio_cells(flare, peer, mixed=True)
    assert cells[0] == "tok/s 1.50x (1.00-2.00x)"
    assert cells[1] == "TTFT p50 0.75x (0.50-1.00x)"
    assert cells[3].startswith("short TTFT p99 1.25x (0.50-2.00x)")
    assert len(serving.ratio_cells(flare, peer, mixed=False)) == 3


def test_every_request_of_a_run_is_distinct_and_pairs_share_their_prompts():
    # No prompt cache may answer a repeat: every request across loads, clients, rounds and repeats
    # differs, while the i-th run on the peer and on flare send the same set.
    runs = [serving.loads(2, repeat) for repeat in range(3)]
    prompts = [p for run in runs for load in run.values() for seq in load for p in seq]
    assert len(prompts) == len(set(prompts)) == 3 * (2 + 4 * 2 + 16 * 2 + 16)
    assert serving.loads(2, 1) == runs[1]
    # The length distribution is kept: four long prompts in the mixed load, the rest short.
    mixed = [seq[0] for seq in runs[2]["mixed 4 long + 12 short"]]
    assert sum(p.endswith(serving.LONG) for p in mixed) == 4
    assert all(len(p) < 80 for p in mixed[4:])

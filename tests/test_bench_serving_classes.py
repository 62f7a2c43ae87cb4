"""bench/serving.py --loads classes: the figures of a run and the classes/default ratios of each pair."""

import importlib.util
import pathlib
import sys

BENCH = pathlib.Path(__file__).resolve().parents[1] / "bench"


def _load(name):
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name.removeprefix('bench_')}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


serving = _load("bench_serving")
classes = _load("bench_serving_classes")


def test_gaps_are_between_consecutive_chunks_of_one_stream():
    assert classes.interactive_gaps([1.0, 1.5, 1.75, 3.0]) == [0.5, 0.25, 1.25]
    assert classes.interactive_gaps([2.0]) == []


def test_batch_tok_s_counts_only_the_window():
    run = classes.ClassRun("classes", batch_tokens=300, window=60.0)
    assert run.batch_tok_s == 5.0
    assert classes.ClassRun("default").batch_tok_s != classes.ClassRun("default").batch_tok_s  # no window: NaN


def test_the_report_pairs_the_ith_classes_run_with_the_ith_default_run():
    def run(mode, ttft, gaps, tokens):
        return classes.ClassRun(mode, list(ttft), list(gaps), tokens, 10.0)

    runs = {"default": [run("default", [2.0, 4.0, 8.0], [0.2, 0.4], 100), run("default", [1.0], [0.1], 50)],
            "classes": [run("classes", [1.0, 2.0, 2.0], [0.2, 0.2], 50), run("classes", [1.0], [0.1], 50)]}
    lines = classes.report(runs, serving.pct, serving.spread, 12)
    assert len(lines) == 6 and lines[0].startswith("[classes] default ") and lines[2].startswith("[classes] classes")
    summary = lines[4]
    # pair 1: TTFT p50 2/4, p99 2/8, gap p99 0.2/0.4, batch 50/100; pair 2: all 1.
    assert summary == ("classes/default: interactive TTFT p50 0.75x (0.50-1.00x), TTFT p99 0.62x (0.25-1.00x), "
                       "gap p99 0.75x (0.50-1.00x), batch tok/s 0.75x (0.50-1.00x)")
    assert "server slots: 12" in lines[5]

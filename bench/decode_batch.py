"""Which decode batch the scheduler picks for N ready streams, given this CPU's graph costs.

Why: on the 2-core machine `bench/serving.py` saw 16 streams decode mostly at B=4 although the
warm-up measured decode[B=16] at 23 ms per row against 32 ms at B=4. This bench replays that
decision with the real server stack (build_backend, create_app, the runtime, the Helios
scheduler) on the sim engine paced in real time, with the sim's graph times set to a `flare run`
warm-up line and the scheduler seeded with them as the warm-up seeds it. The machine's load
then cannot change the costs, so the batch mix is the scheduler's choice alone.

Finding (2026-12-01): with the default 100 ms rate time constant (`adaptation_ms`), every
graph on this CPU lasts longer than the constant, and 16 ready streams decode at B=4; with
1,000 ms they decode at B=16 and B=8. `flare run --scheduler-adaptation-ms MS` sets it.

Run: .venv/bin/python bench/decode_batch.py [--streams 16] [--adaptation-ms 100 1000]
     [--warmup "decode[B=1] 118 ms, decode[B=4] 130 ms, ..."]
"""

from __future__ import annotations

import argparse
import collections
import pathlib
import re
import sys
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fastapi.testclient import TestClient  # noqa: E402

from helios.server import EngineOptions, ServerSettings, build_backend, create_app  # noqa: E402
from tests.server.plan_trace import TracingCore  # noqa: E402

# `flare run`'s warm-up line on the idle 2-core machine, 2026-12-01 11:40 UTC (load average 0.9).
IDLE_CPU = ("decode[B=1] 118 ms, decode[B=2] 106 ms, decode[B=4] 130 ms, decode[B=8] 183 ms, "
            "decode[B=16] 375 ms, decode[B=32] 615 ms, prefill[B=1,C=64] 545 ms, prefill[B=1,C=256] 1566 ms, "
            "prefill[B=2,C=64] 980 ms, prefill[B=4,C=64] 1781 ms")


class WarmupCost:
    """Sim graph times from a warm-up line; a shape it lacks costs as its nearest listed batch."""

    def __init__(self, line: str):
        self.ms = {label: float(ms) for label, ms in re.findall(r"(\w+\[[^\]]+\]) (\d+(?:\.\d+)?) ms", line)}

    def duration_ns(self, shape, context_lens) -> int:
        return int(self.label_ms(shape.label()) * 1e6)

    def label_ms(self, label: str) -> float:
        if label not in self.ms:
            same = [k for k in self.ms if k.split("[")[0] == label.split("[")[0]]
            label = min(same, key=lambda k: abs(_batch(k) - _batch(label)))
        return self.ms[label]


def _batch(label: str) -> int:
    return int(re.search(r"B=(\d+)", label).group(1))


def run(streams: int, adaptation_ms: float, cost: WarmupCost, tokens: int) -> tuple[dict, float, float]:
    backend = build_backend(EngineOptions(engine="sim", slots=32, max_context=1024, prefill_capacity=256,
                                          sim_pace=1.0, adaptation_ms=adaptation_ms))
    backend.core.cost_model = cost
    backend.scheduler.seed_costs({s: (cost.duration_ns(s, ()),) for s in backend.core.catalog}, time.monotonic_ns())
    trace = backend.core = TracingCore(backend.core)
    client = TestClient(create_app(backend, ServerSettings(max_queue=64)))
    with client:
        threads = [threading.Thread(target=client.post, args=("/v1/completions",),
                                    kwargs={"json": {"prompt": f"stream {i} " * 4, "max_tokens": tokens}})
                   for i in range(streams)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(900)
    steps = trace.snapshot()
    mix = collections.Counter(s.label for s in steps if not s.kind.is_prefill)
    rows = sum(len(s.lanes) for s in steps if not s.kind.is_prefill)
    graph_s = sum(cost.label_ms(s.label) for s in steps) / 1e3
    return dict(sorted(mix.items(), key=lambda kv: _batch(kv[0]))), rows / max(1, sum(mix.values())), graph_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--adaptation-ms", type=float, nargs="+", default=[100.0, 1000.0])
    ap.add_argument("--warmup", default=IDLE_CPU, help="a `flare run` warm-up line (graph costs)")
    a = ap.parse_args()
    cost = WarmupCost(a.warmup)
    for tau in a.adaptation_ms:
        mix, rows, busy = run(a.streams, tau, cost, a.tokens)
        print(f"{a.streams} streams x {a.tokens} tokens, adaptation_ms {tau:g}: decode graphs {mix}, "
              f"{rows:.1f} rows per decode graph, {busy:.1f} s of graph time", flush=True)


if __name__ == "__main__":
    main()

"""Tensor parallelism on this CPU: tokens/s with 1 and 2 ranks, and the share of time in
collectives (the gloo all-reduces, two per layer).

Both runs serve the same requests (greedy, the same chat prompts) to completion through the
SyncDriver and the Helios scheduler, without warm-up seeding (costs are learned online, the same way for both). tokens/s = output tokens / wall
time of the run. collectives = the all-reduce time each rank measured / that rank's execution
intervals, summed over the run. Each rank gets one thread (2 ranks: 2 threads in all), so on a
2-core machine shared with other work no speedup is expected: the row shows the overhead. The
1-minute load average is printed with the row.

Run: .venv/bin/python bench/tensor_parallel.py [--requests 2] [--tokens 32]
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from helios.config import PolicyConfig
from helios.engine.tensor_parallel import TensorParallelCore
from helios.engine.torch_core import TorchCore
from helios.runtime.driver import SyncDriver
from helios.scheduler import Scheduler

CORE = dict(max_context=256, prefill_chunks=(64,), max_batch=2, request_slots=2)
QUESTIONS = ("What is the capital of France?", "Name three primary colors.", "What is 2 + 2?",
             "Say hello in French.")


def run(core, prompts, tokens):
    scheduler = Scheduler(core.catalog, PolicyConfig(), core.scheduler_config())
    d = SyncDriver(scheduler, core)
    start = time.perf_counter()
    handles = [d.submit(p, tokens, ignore_eos=True) for p in prompts]
    d.run()
    wall = time.perf_counter() - start
    return sum(len(d.requests[h].tokens) for h in handles), wall, len(d.history)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=32)
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = []
    one = TorchCore(**CORE)
    tok = one.tokenizer
    prompts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": q}]))
               for q in (QUESTIONS * args.requests)[: args.requests]]
    load = os.getloadavg()[0]
    n, wall, frames = run(one, prompts, args.tokens)
    rows.append((1, n / wall, frames, None, load))
    del one
    with TensorParallelCore(2, num_threads=1, **CORE) as tp:
        sums = {"interval": [0, 0], "coll": [0, 0]}
        execute = tp.execute

        def timed(plan, fence):
            ex = execute(plan, fence)
            for r in range(2):
                sums["interval"][r] += ex.timing.rank_intervals_ns[r]
                sums["coll"][r] += tp.last_collective_ns[r]
            return ex

        tp.execute = timed
        load = os.getloadavg()[0]
        n, wall, frames = run(tp, prompts, args.tokens)
        share = [sums["coll"][r] / max(1, sums["interval"][r]) for r in range(2)]
        rows.append((2, n / wall, frames, share, load))
    print(f"requests={args.requests} output tokens each={args.tokens} threads per rank=1 "
          f"cores={os.cpu_count()}")
    print("| ranks | tokens/s | frames | time in collectives (rank 0 / rank 1) | load avg 1 min |")
    print("|---:|---:|---:|---|---:|")
    for ranks, tps, frames, share, load in rows:
        coll = "-" if share is None else " / ".join(f"{s:.0%}" for s in share)
        print(f"| {ranks} | {tps:.2f} | {frames} | {coll} | {load:.1f} |")


if __name__ == "__main__":
    main()

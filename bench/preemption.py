"""Automatic preemption on the real model: short requests arriving while long generations hold
every slot, with the policy on against off, in one run.

Workload (greedy, EOS ignored so every length is exact): `--slots` 2 request slots; two long
generations of `--long-tokens` (200) start together; once both have `--lead` (20) output tokens,
`--shorts` (4) requests of `--short-tokens` (16) arrive, one every `--gap-ms` (150 ms) of wall
time. Everything runs through the synchronous driver (helios.runtime.driver) on the monotonic
clock, on TorchCore with a checkpoint store (the SNAPSHOT/RESTORE graphs preemption needs) and
the scheduler `flare run` builds: the balanced preset, warm-up timings, and

- on:  PreemptionConfig(PRICE) with its defaults (price ratio 4, quantum 500 ms, 1 retiring),
       i.e. `flare run` without flags;
- off: `--preemption off`.

Printed per mode: short-request TTFT (first token minus arrival) p50/p99 and their completion
time p50, each long request's completion time (from its arrival), the makespan, how many
preemptions (restores of a long request) ran, and whether every request's tokens are identical
across the two modes.

Run: PYTHONPATH=. .venv/bin/python bench/preemption.py [--long-tokens 200] [--shorts 4]
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import torch

from helios.config import PreemptionConfig, PreemptionPolicy, preset
from helios.engine.torch_core import TorchCore, load_model
from helios.graphs import GraphKind
from helios.runtime.driver import SyncDriver
from helios.scheduler import Scheduler
from helios.server.warmup import WarmupConfig, warm_up

LONG = ("Write a long story about a lighthouse keeper.", "Describe, in detail, how a city wakes up.")
SHORT = ("Name a color.", "Name a fruit.", "Name an animal.", "Name a planet.", "Name a tree.", "Name a river.")


def percentile(values, q):
    v = sorted(values)
    return v[min(len(v) - 1, int(round(q * (len(v) - 1))))] if v else float("nan")


def run(loaded, policy: PreemptionPolicy, args) -> dict:
    core = TorchCore(loaded=loaded, request_slots=args.slots, max_context=args.max_context, prefill_chunks=(64,),
                     max_batch=args.slots, checkpoint_memory=args.checkpoint_mib << 20)
    config = dataclasses.replace(core.scheduler_config(), preemption=PreemptionConfig(policy))
    scheduler = Scheduler(core.catalog, preset("balanced"), config)
    warm_up(scheduler, core, WarmupConfig(rounds=2, budget_s=15.0))
    driver = SyncDriver(scheduler, core)
    tok = core.tokenizer

    def ids(text):
        return tok.encode(tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True))

    start = time.monotonic_ns()
    longs = [driver.submit(ids(LONG[i % 2]), args.long_tokens, ignore_eos=True, temperature=0.0) for i in range(2)]
    while min(len(driver.requests[h].tokens) for h in longs) < args.lead:
        driver.step()
    shorts, first = [], time.monotonic_ns()
    while len(shorts) < args.shorts or driver.loop.live(list(driver.requests)):
        due = first + len(shorts) * args.gap_ms * 1_000_000
        if len(shorts) < args.shorts and time.monotonic_ns() >= due:
            shorts.append(driver.submit(ids(SHORT[len(shorts) % len(SHORT)]), args.short_tokens,
                                        ignore_eos=True, temperature=0.0))
            continue
        if not driver.step() and len(shorts) < args.shorts:
            time.sleep(max(0.0, (due - time.monotonic_ns()) / 1e9))
    reqs = driver.requests
    restores = sum(1 for p in driver.history if p.shape.kind is GraphKind.RESTORE for h in p.handles if h in longs)
    return {
        "ttft_ms": [(reqs[h].first_token_ns - reqs[h].admitted_ns) / 1e6 for h in shorts],
        "short_done_ms": [(reqs[h].finished_ns - reqs[h].admitted_ns) / 1e6 for h in shorts],
        "long_done_ms": [(reqs[h].finished_ns - reqs[h].admitted_ns) / 1e6 for h in longs],
        "makespan_ms": (max(r.finished_ns for r in reqs.values()) - start) / 1e6,
        "preemptions": restores,
        "tokens": [tuple(reqs[h].tokens) for h in longs + shorts],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--slots", type=int, default=2)
    ap.add_argument("--long-tokens", type=int, default=200)
    ap.add_argument("--short-tokens", type=int, default=16)
    ap.add_argument("--shorts", type=int, default=4)
    ap.add_argument("--lead", type=int, default=20)
    ap.add_argument("--gap-ms", type=float, default=150.0)
    ap.add_argument("--max-context", type=int, default=512)
    ap.add_argument("--checkpoint-mib", type=int, default=256)
    args = ap.parse_args()
    torch.manual_seed(0)
    loaded = load_model()
    results = {}
    for policy in (PreemptionPolicy.OFF, PreemptionPolicy.PRICE):
        results[policy] = r = run(loaded, policy, args)
        print(f"{'on ' if policy is PreemptionPolicy.PRICE else 'off'}: short TTFT p50 {percentile(r['ttft_ms'], 0.5):8.1f} ms"
              f"  p99 {percentile(r['ttft_ms'], 0.99):8.1f} ms  short done p50 {percentile(r['short_done_ms'], 0.5):8.1f} ms"
              f"  long done {', '.join(f'{v:.0f}' for v in r['long_done_ms'])} ms"
              f"  makespan {r['makespan_ms']:.0f} ms  preemptions {r['preemptions']}", flush=True)
    off, on = results[PreemptionPolicy.OFF], results[PreemptionPolicy.PRICE]
    print(f"short TTFT p50 on/off: {percentile(on['ttft_ms'], 0.5) / percentile(off['ttft_ms'], 0.5):.3f}; "
          f"p99 on/off: {percentile(on['ttft_ms'], 0.99) / percentile(off['ttft_ms'], 0.99):.3f}; "
          f"tokens identical: {on['tokens'] == off['tokens']}")


if __name__ == "__main__":
    main()

"""Where first tokens go: the anatomy of TTFT for a few schedulers at one load (its figures:
docs/studies/2026-12-utility-study-log.md, "Where Helios still loses").

    python scripts/ttft_anatomy.py --trace azure --load 1.0 --schedulers 'sarathi,helios-balanced' [--seed 0]

Runs each scheduler on the report's window (the shortest start of the trace holding --min-requests
requests, mixed graphs for Helios) and prints, from the simulator's step and request logs:
- the device's graphs: busy seconds, count and mean duration;
- output gaps (mean, p90) and how long a request decodes (first to last token, mean);
- TTFT split into the wait for the request's first graph and the time from there to its first token;
- the decode-only graphs that ran while some arrived prompt still had no first token;
- the graphs that carried prompt tokens, their device time and the prompt tokens each carried on average;
- how much of the requests' wait for their first graph passed with every request slot held (a request
  holds one from its first graph to its last token), i.e. a wait for a slot rather than for the device;
- for the requests that missed the TTFT SLO, where their time went: the wait for their first graph,
  the wait before their final prompt chunk (from the end of the graph before it), and the rest (the
  chunks themselves and the other waits between them).
"""

from __future__ import annotations

import argparse

import numpy as np

from helios.cli import _names
from helios.sim.experiment import default_slo, nominal_load, run_workload, setup_from_flags
from helios.sim.metrics import NS_PER_S, request_gaps_ms
from helios.sim.workload import load_workload, rescale, window_for


def anatomy(trace: str, scheduler: str, load: float, seed: int, min_requests: int,
            prefill_capacity: int | None = None, mixed_prompt_capacity: int | None = None,
            cost_model: str | None = None) -> tuple[str, str]:
    setup = setup_from_flags(mixed_prefill=True, prefill_capacity=prefill_capacity,  # None: the default
                             mixed_prompt_capacity=mixed_prompt_capacity, cost_model=cost_model)
    window_s = window_for(trace, min_requests, max_context=setup.max_context)
    base = load_workload(trace, window_s, seed=0)
    scale = load / nominal_load(base, int(window_s * NS_PER_S), setup)
    slo = default_slo(base, setup)
    r = run_workload(scheduler, rescale(base, scale), setup, seed=seed, slo=slo, scale=scale,
                     arrival_window_ns=int(window_s / scale * NS_PER_S), progress=False)
    steps = r.sim.steps
    served = {h: log for h, log in r.sim.logs.items() if log.publications}
    logs = list(served.values())
    durations = np.array([(s.end_ns - s.start_ns) / 1e6 for s in steps])
    first_graph, prompt_graphs = {}, {}
    for s in steps:
        for h in s.handles:
            first_graph.setdefault(h, s.start_ns)
            log = served.get(h)
            if log is not None and s.start_ns < log.publications[0][0]:
                prompt_graphs.setdefault(h, []).append(s)
    arrival = np.array([log.arrival_ns for log in logs])
    first_token = np.array([log.publications[0][0] for log in logs])
    wait = (np.array([first_graph[h] for h in served]) - arrival) / 1e6
    prompt = (first_token - arrival) / 1e6 - wait
    gaps = np.concatenate([request_gaps_ms(log) for log in logs])
    life = np.array([(log.publications[-1][0] - log.publications[0][0]) / 1e9 for log in logs])
    # Decode-only graphs that started while an arrived prompt had no first token yet.
    starts = np.array([s.start_ns for s in steps])
    waiting = np.zeros(len(steps) + 1, dtype=np.int64)  # an index past the last step is legal
    np.add.at(waiting, np.searchsorted(starts, arrival), 1)
    np.add.at(waiting, np.searchsorted(starts, first_token), -1)
    decode = np.array([s.label.startswith("decode") for s in steps]) & (np.cumsum(waiting)[:-1] > 0)
    # Prompt throughput: the prompt tokens each graph carried (a request's prefill records end with the
    # graph that ran them), over the graphs that carried any and their device time.
    carried: dict[int, int] = {}
    for log in r.sim.logs.values():
        for end_ns, tokens in log.prefills:
            carried[end_ns] = carried.get(end_ns, 0) + tokens
    tokens = np.array([carried.get(s.end_ns, 0) for s in steps])
    bearing = tokens > 0

    slot_bound = _slot_bound_share(np.array([first_graph[h] for h in served]), arrival,
                                   np.array([log.publications[-1][0] for log in logs]), setup.request_slots)

    # The wait before the final chunk: from the end of the request's previous graph to the start of
    # the one that produced its first token (zero for a prompt served in one graph).
    final = np.array([(g[-1].start_ns - g[-2].end_ns) / 1e6 if len(g) > 1 else 0.0
                      for g in (prompt_graphs[h] for h in served)])
    ttft = wait + prompt
    missed = ttft > slo.ttft_ms

    def spread(x):
        return f"{np.median(x):,.0f} / {x.mean():,.0f} / {np.percentile(x, 90):,.0f}"

    def mean(x):
        return f"{x[missed].mean():,.0f}" if missed.any() else "-"
    split = (f"| `{scheduler}` | {int(missed.sum())} | {mean(ttft)} | {mean(wait)} | {mean(final)} | "
             f"{mean(ttft - wait - final)} | {np.median(final):,.0f} / {np.percentile(final, 90):,.0f} |")
    return (f"| `{scheduler}` | {durations.sum() / 1e3:,.0f} | {len(steps):,} | {durations.mean():.0f} | "
            f"{gaps.mean():.1f} / {np.percentile(gaps, 90):.0f} | {life.mean():.2f} | {spread(wait)} | "
            f"{spread(prompt)} | {int(decode.sum()):,} ({durations[decode].sum() / 1e3:,.0f} s) | "
            f"{int(bearing.sum()):,} ({durations[bearing].sum() / 1e3:,.0f} s), "
            f"{tokens[bearing].mean() if bearing.any() else 0:.0f} | {slot_bound:.0%} of {wait.sum() / 1e3:,.0f} s |"), split


def _slot_bound_share(start: np.ndarray, arrival: np.ndarray, end: np.ndarray, slots: int) -> float:
    """The share of the waits [arrival, start) that passed with `slots` requests holding a slot, each
    from its first graph (start) to its last token (end)."""
    times = np.concatenate([start, end])
    order = np.argsort(times, kind="stable")
    t = times[order]
    held = np.cumsum(np.concatenate([np.ones(len(start)), -np.ones(len(end))])[order])
    full = (held >= slots).astype(float)
    # F(x): time with every slot held in [t[0], x), piecewise linear between events.
    cum = np.concatenate([[0.0], np.cumsum(full[:-1] * np.diff(t))])

    def full_until(x):
        i = np.clip(np.searchsorted(t, x, side="right") - 1, 0, None)
        return np.where(x < t[0], 0.0, cum[i] + (x - t[i]) * full[i])
    waits = (start - arrival).clip(0)
    return float((full_until(start) - full_until(arrival)).sum() / waits.sum()) if waits.sum() > 0 else 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default="azure")
    ap.add_argument("--load", type=float, default=1.0)
    ap.add_argument("--schedulers", default="sarathi,helios-balanced")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--min-requests", type=int, default=1000)
    ap.add_argument("--prefill-capacity", type=int, help="the most prompt tokens in one prefill graph (flare sim report's flag)")
    ap.add_argument("--mixed-prompt-capacity", type=int, help="the largest mixed prompt chunk (flare sim report's flag)")
    ap.add_argument("--cost-model", help="the cost model (flare sim report's flag; default h100-70b)")
    args = ap.parse_args()
    print("| scheduler | busy s | graphs | mean graph ms | gap mean / p90 ms | decoding s | "
          "wait for first graph p50 / mean / p90 ms | first graph to first token p50 / mean / p90 ms | "
          "decode-only graphs while prompts waited | prompt-bearing graphs (s), prompt tokens per graph | "
          "wait for first graph with every slot held |")
    print("|---|---:|---:|---:|---|---:|---|---|---|---|---|")
    splits = []
    for name in _names(args.schedulers):
        row, split = anatomy(args.trace, name, args.load, args.seed, args.min_requests, args.prefill_capacity,
                              args.mixed_prompt_capacity, args.cost_model)
        print(row, flush=True)
        splits.append(split)
    print("\n| scheduler | missed the TTFT SLO | their mean TTFT ms | = wait for first graph | + wait before the "
          "final chunk | + the rest | final-chunk wait, every request, p50 / p90 ms |")
    print("|---|---:|---:|---:|---:|---:|---|")
    print("\n".join(splits))


if __name__ == "__main__":
    main()

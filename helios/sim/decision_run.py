"""`flare sim run`: one simulated run that keeps its decision log, for `flare sim explain`.

A RUN directory holds
- run.json: what ran (scheduler, trace, load, window, seed, cost model) and the headline metrics;
- requests.jsonl: one line per request (handle, client, arrival, first output, finish, tokens);
- decisions.jsonl: every decision of the run, in order, as /debug/decisions shows them
  (helios.runtime.decision_format), with the prices of every waiting and decoding request.
Times are virtual seconds from the start of the trace.
"""

from __future__ import annotations

import json
from pathlib import Path

from helios.runtime.decisions import DecisionLog
from helios.sim.experiment import Setup, default_slo, nominal_load, run_workload
from helios.sim.metrics import NS_PER_S
from helios.sim.workload import load_workload, rescale

ALL_PRICES = 64  # selection is bounded to 64 request slots: every priced request is kept
ALL_ALTERNATIVES = 32  # enough to hold the best graph serving each waiting request


def request_rows(sim) -> list[dict]:
    rows = []
    for handle, log in sorted(sim.logs.items()):
        first = log.publications[0][0] if log.publications else None
        rows.append({"handle": handle, "client": log.client, "arrival_s": log.arrival_ns / NS_PER_S,
                     "prompt_tokens": log.prompt_tokens, "cached_tokens": log.cached_tokens,
                     "first_output_s": None if first is None else first / NS_PER_S,
                     "finished_s": None if log.finished_ns is None else log.finished_ns / NS_PER_S,
                     "output_tokens": log.output_tokens,
                     "finish": None if log.finish is None else log.finish.value,
                     "publications_s": [t / NS_PER_S for t, _ in log.publications]})
    return rows


def run_and_write(out: str | Path, *, scheduler: str, trace: str, load: float, window_s: float, seed: int,
                  setup: Setup) -> Path:
    """Simulate `trace`'s first `window_s` seconds at nominal `load` and write the RUN directory."""
    base = load_workload(trace, window_s, seed=seed, max_context=setup.max_context)
    if not base:
        raise ValueError(f"the first {window_s} s of {trace} hold no request")
    scale = load / nominal_load(base, int(window_s * NS_PER_S), setup)
    log = DecisionLog(maxlen=4096, top_prices=ALL_PRICES, top_alternatives=ALL_ALTERNATIVES,
                      always_detail=True)
    requests = rescale(base, scale)
    result = run_workload(scheduler, requests, setup, seed=seed, slo=default_slo(base, setup), scale=scale,
                          arrival_window_ns=int(window_s / scale * NS_PER_S), decisions=log)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rows = request_rows(result.sim)
    (out / "run.json").write_text(json.dumps({
        "scheduler": scheduler, "trace": trace, "load": load, "rate_scale": scale, "window_s": window_s,
        "seed": seed, "cost_model": setup.cost_model, "requests": len(rows),
        "decisions": len(result.sim.decision_log), "metrics": result.metrics.as_dict()}, indent=1, default=str))
    with open(out / "requests.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    with open(out / "decisions.jsonl", "w") as f:
        f.writelines(json.dumps(d) + "\n" for d in result.sim.decision_log)
    return out

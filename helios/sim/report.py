"""`flare sim report`: every scheduler on the same traces, cost model and seeds; Markdown + PNG report.

For each (trace, scheduler, seed) one task runs the load levels and the goodput sweep, sharing runs
between them (the sweep grid contains the load levels). Tasks are independent, so `jobs > 1` runs
them in worker processes without changing any result; `seeds.combine` then gives mean and range.
"""

from __future__ import annotations

import json
import os
import sys
import time
import functools
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from helios.sim import plots
from helios.sim.experiment import (REUSE_SUFFIX, SCHEDULERS, Setup, build_scheduler, default_slo, nominal_load,
                                   run_workload)
from helios.sim.metrics import NS_PER_S, SLO, goodput_sweep, request_gaps_ms, ttft_ms
from helios.sim.report_md import write_markdown
from helios.sim.report_tasks import Interrupted, Plan, Progress, run_tasks
from helios.sim.seeds import combine
from helios.sim.workload import load_workload, loads_of, rescale, trace_label, window_for


@dataclass(frozen=True)
class ReportConfig:
    """What to run. Loads and sweep points are nominal loads (`experiment.nominal_load`).

    The window of each trace holds at least `min_requests` requests (`workload.window_for`) unless
    `window_s` fixes it. Every (trace, scheduler) runs once per seed; the report gives the mean and
    the range. Goodput bisects until the last passing and first failing loads are within
    `resolution` of each other (geometrically), at most `refine` steps. `ablation` names Helios
    variants (`experiment.split_variant`) run on `ablation_traces` only, for the ablation table.
    `prefix_reuse` adds, on every trace whose requests carry block hashes (Mooncake), each scheduler
    once more with automatic prefix reuse (`<name>+reuse`, `experiment.split_reuse`), for the
    prefix-reuse table.
    """

    traces: tuple[str, ...] = ("azure", "mooncake", "multi")
    schedulers: tuple[str, ...] = SCHEDULERS
    window_s: float | None = None
    min_requests: int = 1000
    loads: tuple[float, ...] = (0.2, 0.4, 0.6)
    sweep: tuple[float, ...] = (0.2, 0.4, 0.6, 0.8, 1.0, 1.4, 2.0)  # contains the loads: their runs are reused
    refine: int = 8
    resolution: float = 0.05
    extend_down: int = 2  # halvings below the grid when its first point already fails
    seeds: tuple[int, ...] = (0, 1, 2)
    ablation: tuple[str, ...] = ()
    ablation_traces: tuple[str, ...] = ("azure", "mooncake")
    prefix_reuse: bool = False
    setup: Setup = field(default_factory=Setup)
    ttft_slo_scale: float = 5.0
    gap_slo_scale: float = 10.0
    jobs: int = field(default_factory=lambda: min(2, os.cpu_count() or 1))

    @property
    def seed(self) -> int:
        """The seed that fixes each workload (its window, SLOs and `multi`'s arrivals)."""
        return self.seeds[0]


def quick(config: ReportConfig) -> ReportConfig:
    """The smoke configuration: a 10-second window, one seed, one load, a one-point sweep."""
    return replace(config, window_s=10.0, loads=(0.3,), sweep=(0.3,), refine=0, extend_down=0,
                   seeds=config.seeds[:1])


def window_s(trace: str, cfg: ReportConfig) -> float:
    """The replayed window of a trace: `cfg.window_s` when set ("multi", ShareGPT lengths at 7 req/s,
    carries about four times the tokens per trace-second of the real traces and replays a quarter of
    it), else the shortest window holding `cfg.min_requests` requests."""
    if cfg.window_s is not None:
        return cfg.window_s / 4 if trace == "multi" else cfg.window_s
    return window_for(trace, cfg.min_requests, seed=cfg.seed, max_context=cfg.setup.max_context)


@dataclass(frozen=True)
class Workload:
    trace: str
    requests: int
    window_s: float
    base_rate: float  # requests per second at rate_scale 1
    load_at_1: float  # nominal load at rate_scale 1
    slo: SLO


def _workload(trace: str, cfg: ReportConfig) -> Workload:
    window = window_s(trace, cfg)
    base = load_workload(trace, window, seed=cfg.seed, max_context=cfg.setup.max_context)
    window_ns = int(window * NS_PER_S)
    return Workload(trace, len(base), window, len(base) / window, nominal_load(base, window_ns, cfg.setup),
                    default_slo(base, cfg.setup, cfg.ttft_slo_scale, cfg.gap_slo_scale))


def run_task(trace: str, scheduler: str, seed: int, cfg: ReportConfig, wl: Workload) -> dict:
    """Loads and goodput sweep of one scheduler on one trace with one seed (module level, so workers
    can run it). The workload is the same for every seed; the seed moves SimCore's timing noise (and
    the acceptance draws of speculative runs)."""
    t0 = time.perf_counter()
    base = load_workload(trace, wl.window_s, seed=cfg.seed, max_context=cfg.setup.max_context)
    runs: dict[float, object] = {}

    def run(load: float):
        if load not in runs:
            scale = load / wl.load_at_1
            runs[load] = run_workload(scheduler, rescale(base, scale), cfg.setup, seed=seed, slo=wl.slo,
                                      scale=scale, arrival_window_ns=int(wl.window_s / scale * NS_PER_S),
                                      progress=False)
        return runs[load]

    loads = {}
    for load in loads_of(trace, cfg.loads):
        r = run(load)
        logs = list(r.sim.logs.values())
        loads[load] = {"scale": r.scale, "metrics": r.metrics.as_dict(),
                       "ttft_ms": np.array([v for log in logs if (v := ttft_ms(log)) is not None]),
                       "gaps_ms": np.concatenate([request_gaps_ms(log) for log in logs] or [np.zeros(0)])}
        r.sim = None  # the logs are summarized; free them before the sweep

    def metrics_at(load: float):
        r = run(load)
        r.sim = None  # the sweep needs the metrics only
        return r.metrics

    sweep = goodput_sweep(metrics_at, loads_of(trace, cfg.sweep), target=wl.slo.target, refine=cfg.refine,
                          extend_down=cfg.extend_down, resolution=cfg.resolution)
    points = sorted((load, r.metrics.offered_rate, r.metrics.slo_attainment) for load, r in runs.items())
    return {"trace": trace, "scheduler": scheduler, "seed": seed, "loads": loads, "goodput": sweep,
            "points": points, "runs": len(runs), "wall_s": time.perf_counter() - t0}


def reuse_traces(cfg: ReportConfig, workloads: dict) -> list[str]:
    """The traces that get prefix-reuse rows: with `cfg.prefix_reuse`, those whose requests carry block hashes."""
    if not cfg.prefix_reuse:
        return []
    return [t for t in cfg.traces
            if any(r.prefix_blocks for r in load_workload(t, workloads[t].window_s, seed=cfg.seed,
                                                          max_context=cfg.setup.max_context))]


def usable_schedulers(names, setup: Setup) -> tuple[list[str], dict[str, str]]:
    """The names that construct, and a reason for each that does not (printed and reported)."""
    ok, skipped = [], {}
    for name in names:
        try:
            build_scheduler(name, setup.catalog(), setup.config())
            ok.append(name)
        except Exception as exc:  # a baseline still being written must not sink the whole report
            skipped[name] = f"{type(exc).__name__}: {exc}"
            print(f"flare sim report: skipping scheduler {name!r} ({skipped[name]})", file=sys.stderr)
    return ok, skipped


def run_report(cfg: ReportConfig, out_dir: str | os.PathLike, *, command: str = "",
               progress: bool = True) -> Path:
    """Run everything, write report.md, results.json and the PNGs into `out_dir`; returns report.md.
    With `progress`, the plan and a line per finished task go to stderr. Ctrl-C raises
    report_tasks.Interrupted after writing the finished tasks to `out_dir`/partial-results.json."""
    t0 = time.perf_counter()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    schedulers, skipped = usable_schedulers(cfg.schedulers, cfg.setup)
    variants, skipped_variants = usable_schedulers(cfg.ablation, cfg.setup)
    skipped.update(skipped_variants)
    workloads = {t: _workload(t, cfg) for t in cfg.traces}
    pairs = [(t, s) for t in cfg.traces for s in schedulers]
    pairs += [(t, v) for t in cfg.traces if t in cfg.ablation_traces for v in variants if v not in schedulers]
    pairs += [(t, s + REUSE_SUFFIX) for t in reuse_traces(cfg, workloads) for s in schedulers]
    tasks = [(t, s, seed) for t, s in pairs for seed in cfg.seeds]
    # Longest first (Helios on the long-prompt trace): the pool's last task then ends soonest.
    tasks.sort(key=lambda k: (not k[1].startswith("helios"), k[0] != "mooncake"))
    plan = make_plan(cfg, tasks, workloads)
    stream = sys.stderr if progress else open(os.devnull, "w")
    print(f"flare sim report: {plan.describe(quick=cfg.window_s is not None and cfg.window_s <= 10)}",
          file=stream, flush=True)
    try:
        per_seed = run_tasks(tasks, functools.partial(_task, cfg=cfg, workloads=workloads), cfg.jobs,
                             Progress(len(tasks), stream))
    except Interrupted as stop:
        _write_partial(stop.finished, out / "partial-results.json")
        raise
    results = {(t, s): combine([per_seed[(t, s, seed)] for seed in cfg.seeds]) for t, s in pairs}
    figures = _figures(cfg, schedulers, results, workloads, out)
    wall = time.perf_counter() - t0
    _write_json(cfg, [s for _, s in pairs], results, workloads, out / "results.json", wall)
    path = out / "report.md"
    text = write_markdown(cfg, schedulers, skipped, results, workloads, figures, command, wall, variants)
    path.write_text(text)
    return path


def _task(trace: str, scheduler: str, seed: int, *, cfg: ReportConfig, workloads: dict) -> dict:
    return run_task(trace, scheduler, seed, cfg, workloads[trace])


def make_plan(cfg: ReportConfig, tasks: list[tuple], workloads: dict) -> Plan:
    """Runs and simulated requests, at most: each task runs the loads and the sweep grid (shared
    points once), then up to `refine` bisection and `extend_down` halving steps."""
    tokens = {t: sum(r.prompt_tokens + r.output_tokens
                     for r in load_workload(t, w.window_s, seed=cfg.seed, max_context=cfg.setup.max_context))
              for t, w in workloads.items()}
    runs = requests = total = 0
    for trace, _, _ in tasks:
        n = len(set(loads_of(trace, cfg.loads)) | set(loads_of(trace, cfg.sweep))) + cfg.refine + cfg.extend_down
        runs += n
        requests += n * workloads[trace].requests
        total += n * tokens[trace]
    return Plan(len(tasks), runs, requests, total, max(1, min(cfg.jobs, len(tasks))))


def _write_partial(finished: dict, path: Path) -> None:
    """The finished tasks of an interrupted report: per task its loads' metrics and its goodput."""
    rows = [{"trace": t, "scheduler": s, "seed": seed, "runs": r["runs"], "wall_s": r["wall_s"],
             "goodput": getattr(r["goodput"], "goodput", None),
             "loads": {str(load): v["metrics"] for load, v in r["loads"].items()}}
            for (t, s, seed), r in finished.items()]
    path.write_text(json.dumps({"finished_tasks": rows}, indent=1, default=float))


def _figures(cfg, schedulers, results, workloads, out: Path) -> dict[str, list[str]]:
    figures: dict[str, list[str]] = {}
    for trace in cfg.traces:
        if not schedulers:
            break
        loads = loads_of(trace, cfg.loads)
        ttft = {load: {s: results[(trace, s)]["loads"][load]["ttft_ms"] for s in schedulers} for load in loads}
        gaps = {load: {s: results[(trace, s)]["loads"][load]["gaps_ms"] for s in schedulers} for load in loads}
        points = {s: results[(trace, s)]["points"] for s in schedulers}
        goodput = {s: results[(trace, s)]["goodput"].goodput for s in schedulers}
        pareto = {s: [(load, results[(trace, s)]["loads"][load]["metrics"]["gap_p99_ms"],
                       results[(trace, s)]["loads"][load]["metrics"]["ttft_p99_ms"]) for load in loads]
                  for s in schedulers}
        label = trace_label(trace)
        names = [f"ttft_cdf_{label}.png", f"gaps_{label}.png", f"goodput_{label}.png", f"pareto_{label}.png"]
        plots.ttft_cdf(ttft, f"{label}: TTFT CDF", out / names[0])
        plots.gap_ccdf(gaps, f"{label}: inter-delivery gaps", out / names[1])
        plots.attainment_vs_rate(points, workloads[trace].slo.target, goodput,
                                 f"{label}: SLO attainment vs request rate", out / names[2])
        plots.pareto(pareto, workloads[trace].slo, f"{label}: TTFT p99 vs gap p99 over loads (seed mean)",
                     out / names[3])
        figures[trace] = names
    return figures


def _write_json(cfg, names, results, workloads, path: Path, wall: float) -> None:
    def goodput(g) -> dict:
        return {"goodput": g.goodput, "min": g.low, "max": g.high, "per_seed": g.per_seed,
                "status": g.status}

    doc = {"wall_s": wall, "windows_s": {t: w.window_s for t, w in workloads.items()}, "loads": cfg.loads,
           "seeds": cfg.seeds, "resolution": cfg.resolution, "cost_model": cfg.setup.cost_model,
           "mixed_prefill": cfg.setup.mixed_prefill,
           "mixed_prompt_steps": cfg.setup.mixed_prompt_steps,
           "mixed_prompt_capacity": cfg.setup.mixed_prompt_capacity,
           "mixed_prompt_rows": cfg.setup.mixed_prompt_rows,
           "prefill_capacity": cfg.setup.prefill_capacity, "prefix_reuse": cfg.prefix_reuse,
           "workloads": {t: {"requests": w.requests, "base_rate": w.base_rate, "load_at_1": w.load_at_1,
                             "slo": {"ttft_ms": w.slo.ttft_ms, "gap_ms": w.slo.gap_ms,
                                     "gap_quantile": w.slo.gap_quantile, "target": w.slo.target}}
                         for t, w in workloads.items()},
           "runs": [{"trace": t, "scheduler": s, "goodput": goodput(results[(t, s)]["goodput"]),
                     "simulated_runs": results[(t, s)]["runs"], "task_wall_s": results[(t, s)]["wall_s"],
                     "loads": {str(load): {"scale": v["scale"], **v["metrics"], "range": v["range"]}
                               for load, v in results[(t, s)]["loads"].items()}}
                    for t in cfg.traces for s in dict.fromkeys(names) if (t, s) in results]}
    path.write_text(json.dumps(doc, indent=1, default=float))

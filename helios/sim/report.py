"""`flare sim report`: every scheduler on the same traces, cost model and seed; Markdown + PNG report.

For each (trace, scheduler) one task runs the load levels and the goodput sweep, sharing runs between
them (the sweep grid contains the load levels). Tasks are independent, so `jobs > 1` runs them in
worker processes without changing any result.
"""

from __future__ import annotations

import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from helios.sim import plots
from helios.sim.experiment import (SCHEDULERS, Setup, build_scheduler, default_slo, load_workload, loads_of,
                                   nominal_load, rescale, run_workload)
from helios.sim.metrics import NS_PER_S, SLO, GoodputResult, goodput_sweep, request_gaps_ms, ttft_ms
from helios.sim.report_md import write_markdown


@dataclass(frozen=True)
class ReportConfig:
    """What to run. Loads and sweep points are nominal loads (`experiment.nominal_load`)."""

    traces: tuple[str, ...] = ("azure", "mooncake", "multi")
    schedulers: tuple[str, ...] = SCHEDULERS
    window_s: float = 60.0
    loads: tuple[float, ...] = (0.2, 0.4, 0.6)
    sweep: tuple[float, ...] = (0.2, 0.4, 0.6, 0.8, 1.0, 1.4, 2.0)  # contains the loads: their runs are reused
    refine: int = 2
    extend_down: int = 2  # halvings below the grid when its first point already fails
    seed: int = 0
    setup: Setup = field(default_factory=Setup)
    ttft_slo_scale: float = 5.0
    gap_slo_scale: float = 10.0
    jobs: int = field(default_factory=lambda: min(2, os.cpu_count() or 1))


def quick(config: ReportConfig) -> ReportConfig:
    """The smoke configuration: a 10-second window, one load, a one-point sweep without bisection."""
    return replace(config, window_s=10.0, loads=(0.3,), sweep=(0.3,), refine=0, extend_down=0)


def window_s(trace: str, cfg: ReportConfig) -> float:
    """The replayed window of a trace. "multi" (ShareGPT lengths at 7 req/s) carries about four times the
    tokens per trace-second of the real traces, so it replays a quarter of the window: every workload then
    costs about the same to simulate."""
    return cfg.window_s / 4 if trace == "multi" else cfg.window_s


@dataclass(frozen=True)
class Workload:
    trace: str
    requests: int
    base_rate: float  # requests per second at rate_scale 1
    load_at_1: float  # nominal load at rate_scale 1
    slo: SLO


def _workload(trace: str, cfg: ReportConfig) -> Workload:
    window = window_s(trace, cfg)
    base = load_workload(trace, window, seed=cfg.seed, max_context=cfg.setup.max_context)
    window_ns = int(window * NS_PER_S)
    return Workload(trace, len(base), len(base) / window, nominal_load(base, window_ns, cfg.setup),
                    default_slo(base, cfg.setup, cfg.ttft_slo_scale, cfg.gap_slo_scale))


def run_task(trace: str, scheduler: str, cfg: ReportConfig, wl: Workload) -> dict:
    """Loads and goodput sweep of one scheduler on one trace (module level, so workers can run it)."""
    t0 = time.perf_counter()
    window = window_s(trace, cfg)
    base = load_workload(trace, window, seed=cfg.seed, max_context=cfg.setup.max_context)
    runs: dict[float, object] = {}

    def run(load: float):
        if load not in runs:
            scale = load / wl.load_at_1
            runs[load] = run_workload(scheduler, rescale(base, scale), cfg.setup, seed=cfg.seed, slo=wl.slo,
                                      scale=scale, arrival_window_ns=int(window / scale * NS_PER_S),
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
                          extend_down=cfg.extend_down)
    points = sorted((load, r.metrics.offered_rate, r.metrics.slo_attainment) for load, r in runs.items())
    return {"trace": trace, "scheduler": scheduler, "loads": loads, "goodput": sweep, "points": points,
            "runs": len(runs), "wall_s": time.perf_counter() - t0}


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
               progress: bool | None = None) -> Path:
    """Run everything, write report.md, results.json and the PNGs into `out_dir`; returns report.md."""
    t0 = time.perf_counter()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    schedulers, skipped = usable_schedulers(cfg.schedulers, cfg.setup)
    workloads = {t: _workload(t, cfg) for t in cfg.traces}
    tasks = [(t, s) for t in cfg.traces for s in schedulers]
    results: dict[tuple[str, str], dict] = {}
    bar = _bar(len(tasks), progress)
    if cfg.jobs > 1 and len(tasks) > 1:
        with ProcessPoolExecutor(max_workers=cfg.jobs) as pool:
            futures = {pool.submit(run_task, t, s, cfg, workloads[t]): (t, s) for t, s in tasks}
            for fut in as_completed(futures):
                results[futures[fut]] = fut.result()
                _tick(bar, futures[fut])
    else:
        for t, s in tasks:
            results[(t, s)] = run_task(t, s, cfg, workloads[t])
            _tick(bar, (t, s))
    if bar is not None:
        bar.close()
    figures = _figures(cfg, schedulers, results, workloads, out)
    wall = time.perf_counter() - t0
    _write_json(cfg, schedulers, results, workloads, out / "results.json", wall)
    path = out / "report.md"
    path.write_text(write_markdown(cfg, schedulers, skipped, results, workloads, figures, command, wall))
    return path


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
        names = [f"ttft_cdf_{trace}.png", f"gaps_{trace}.png", f"goodput_{trace}.png"]
        plots.ttft_cdf(ttft, f"{trace}: TTFT CDF", out / names[0])
        plots.gap_ccdf(gaps, f"{trace}: inter-delivery gaps", out / names[1])
        plots.attainment_vs_rate(points, workloads[trace].slo.target, goodput,
                                 f"{trace}: SLO attainment vs request rate", out / names[2])
        figures[trace] = names
    return figures


def _write_json(cfg, schedulers, results, workloads, path: Path, wall: float) -> None:
    def goodput(g: GoodputResult) -> dict:
        return {"goodput": g.goodput, "load": g.scale, "status": g.status, "points": g.points}

    doc = {"wall_s": wall, "window_s": cfg.window_s, "loads": cfg.loads, "seed": cfg.seed,
           "cost_model": cfg.setup.cost_model, "mixed_prefill": cfg.setup.mixed_prefill,
           "workloads": {t: {"requests": w.requests, "base_rate": w.base_rate, "load_at_1": w.load_at_1,
                             "slo": {"ttft_ms": w.slo.ttft_ms, "gap_ms": w.slo.gap_ms,
                                     "gap_quantile": w.slo.gap_quantile, "target": w.slo.target}}
                         for t, w in workloads.items()},
           "runs": [{"trace": t, "scheduler": s, "goodput": goodput(results[(t, s)]["goodput"]),
                     "simulated_runs": results[(t, s)]["runs"], "task_wall_s": results[(t, s)]["wall_s"],
                     "loads": {str(load): {"scale": v["scale"], **v["metrics"]}
                               for load, v in results[(t, s)]["loads"].items()}}
                    for t in cfg.traces for s in schedulers]}
    path.write_text(json.dumps(doc, indent=1, default=float))


def _bar(total: int, progress: bool | None):
    if progress is None:
        progress = sys.stderr.isatty()
    if not progress:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc="report", unit="task")


def _tick(bar, key) -> None:
    if bar is not None:
        bar.set_postfix_str(f"{key[0]}/{key[1]}")
        bar.update(1)

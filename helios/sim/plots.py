"""PNG figures of the simulator report: TTFT CDFs, inter-delivery gap tails, SLO attainment vs rate,
and the TTFT/gap Pareto view over loads."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import numpy as np


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on servers and CI
    import matplotlib.pyplot as plt

    return plt


def _ecdf(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x = np.sort(np.asarray(values, dtype=np.float64))
    return x, np.arange(1, x.size + 1) / max(x.size, 1)


def _panels(n: int, title: str):
    plt = _pyplot()
    fig, axes = plt.subplots(1, n, figsize=(4.6 * n, 3.8), squeeze=False, sharey=True)
    fig.suptitle(title)
    return plt, fig, axes[0]


def _finish(plt, fig, axes, path: Path) -> Path:
    axes[0].legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _log_panel(ax, load: float, xlabel: str, log_y: bool = False) -> None:
    ax.set_xscale("log")
    if log_y:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_title(f"load {load:g}")
    ax.grid(alpha=0.3, which="both")


def ttft_cdf(series: Mapping[float, Mapping[str, np.ndarray]], title: str, path: Path) -> Path:
    """One panel per load: the CDF of TTFT (seconds, log axis) for each scheduler."""
    plt, fig, axes = _panels(len(series), title)
    for ax, (load, by_sched) in zip(axes, sorted(series.items())):
        for name, ttft_ms in by_sched.items():
            if len(ttft_ms):
                x, y = _ecdf(np.maximum(ttft_ms, 1e-3) / 1e3)
                ax.step(x, y, where="post", label=name, lw=1.2)
        _log_panel(ax, load, "time to first token (s)")
    axes[0].set_ylabel("fraction of requests")
    return _finish(plt, fig, axes, path)


def gap_ccdf(series: Mapping[float, Mapping[str, np.ndarray]], title: str, path: Path) -> Path:
    """One panel per load: the complementary CDF of inter-delivery gaps (log-log), which shows the tail
    that decides the per-request p99 SLO."""
    plt, fig, axes = _panels(len(series), title)
    for ax, (load, by_sched) in zip(axes, sorted(series.items())):
        for name, gaps in by_sched.items():
            if len(gaps):
                x, y = _ecdf(np.maximum(gaps, 1e-3))
                ax.step(x, np.maximum(1.0 - y + 1.0 / x.size, 1e-6), where="post", label=name, lw=1.2)
        _log_panel(ax, load, "inter-delivery gap (ms)", log_y=True)
    axes[0].set_ylabel("fraction of gaps > x")
    return _finish(plt, fig, axes, path)


def attainment_vs_rate(points: Mapping[str, Sequence[tuple[float, float, float]]], target: float,
                       goodput: Mapping[str, float], title: str, path: Path) -> Path:
    """SLO attainment against offered request rate for each scheduler (every sweep and load run), with
    the goodput target; the legend gives each scheduler's goodput."""
    plt, fig, axes = _panels(1, title)
    ax = axes[0]
    for name, pts in points.items():
        pts = sorted(pts, key=lambda p: p[1])
        ax.plot([p[1] for p in pts], [p[2] for p in pts], marker="o", ms=3.5, lw=1.2,
                label=f"{name} (goodput {goodput.get(name, float('nan')):.2f}/s)")
    ax.axhline(target, color="k", lw=0.8, ls="--")
    ax.set_xlabel("offered request rate (req/s)")
    ax.set_ylabel("fraction of requests meeting both SLOs")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    return _finish(plt, fig, axes, path)


def pareto(series: Mapping[str, Sequence[tuple[float, float, float]]], slo, title: str, path: Path) -> Path:
    """TTFT p99 against gap p99 (both log axes), one line per scheduler through its loads in order, each
    point labelled with its load; the dashed lines are the SLOs (the gap SLO bounds each request's own
    p99, so it is a guide here, not a pass line). Down and left is better on both."""
    plt, fig, axes = _panels(1, title)
    ax = axes[0]
    for name, pts in series.items():
        pts = [p for p in sorted(pts) if np.isfinite(p[1]) and np.isfinite(p[2])]
        if not pts:
            continue
        line, = ax.plot([p[1] for p in pts], [p[2] for p in pts], marker="o", ms=3.5, lw=1.2, label=name)
        for load, gap, ttft in pts:
            ax.annotate(f"{load:g}", (gap, ttft), fontsize=6, color=line.get_color(),
                        xytext=(2, 2), textcoords="offset points")
    ax.axvline(slo.gap_ms, color="k", lw=0.8, ls="--")
    ax.axhline(slo.ttft_ms, color="k", lw=0.8, ls="--")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("gap p99 (ms)")
    ax.set_ylabel("TTFT p99 (ms)")
    ax.grid(alpha=0.3, which="both")
    return _finish(plt, fig, axes, path)

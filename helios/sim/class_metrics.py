"""Per-class SLO attainment and multi-SLO goodput (issue 40; docs/simulator.md, "Multi-SLO workload").

A request meets its class's SLO when it finished and every target its class states holds: its TTFT within
the first-token target for its prompt, the 99th percentile of its own gaps within the gap target (vacuous
below two publications), its end-to-end time within the deadline. A class attains its SLO when at least
the workload's `target` (0.9) of its requests meet it. Multi-SLO goodput is the highest total request
rate at which every class attains its own SLO, found by the single-class sweep's bisection.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from helios.scheduler import RequestSpec
from helios.scheduler.service_class import ServiceClass
from helios.sim.experiment import (Setup, decode_ns, load_cost_model, run_workload, solo_prefill_ns,
                                   workload_catalog)
from helios.sim.loop import Arrival, RequestLog
from helios.sim.metrics import NS_PER_S, SLO, e2e_ms, percentile, request_gaps_ms, ttft_ms
from helios.sim.multislo import MultiRequest, MultiWorkload, build_requests, rescale_requests


def resolve_classes(workload: MultiWorkload, requests: Sequence[MultiRequest], setup: Setup) -> dict[str, ServiceClass]:
    """Each class's targets in ms: stated ones as they are, scaled ones on the class's own requests
    (module docstring of helios.sim.multislo) and the setup's cost model. Resolved once, at scale 1."""
    model, catalog = load_cost_model(setup.cost_model), workload_catalog(setup)
    out = {}
    for name, spec in workload.classes.items():
        mine = [r for r in requests if r.service_class == name] or list(requests)
        p90 = int(np.percentile([r.prompt_tokens for r in mine], 90))
        o90 = int(np.percentile([r.output_tokens for r in mine], 90))
        ctx = int(np.median([r.prompt_tokens + r.output_tokens // 2 for r in mine]))
        prefill = solo_prefill_ns(model, catalog, p90) / 1e6
        step = decode_ns(model, 1, ctx) / 1e6
        reference = {"ttft": prefill, "ttft_per_token": prefill / p90, "gap": step,
                     "deadline": prefill + o90 * decode_ns(model, 1, p90 + o90 // 2) / 1e6}
        targets = {**spec.ms, **{k: v * reference[k] for k, v in spec.scale.items()}}
        out[name] = ServiceClass(name, ttft_ms=targets.get("ttft"), ttft_per_token_ms=targets.get("ttft_per_token"),
                                 gap_ms=targets.get("gap"), deadline_ms=targets.get("deadline"),
                                 weight=spec.weight, priority=spec.priority)
    return out


def meets_class(log: RequestLog, cls: ServiceClass, gap_quantile: float = 0.99) -> bool:
    first = ttft_ms(log)
    if first is None or log.finish is None:
        return False
    target = cls.first_token_target_ms(log.prompt_tokens)
    if target is not None and first > target:
        return False
    if cls.gap_ms is not None:
        gaps = request_gaps_ms(log)
        if gaps.size and float(np.quantile(gaps, gap_quantile)) > cls.gap_ms:
            return False
    return cls.deadline_ms is None or e2e_ms(log) <= cls.deadline_ms


@dataclass(frozen=True, slots=True)
class ClassMetrics:
    requests: int
    attainment: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    gap_p99_ms: float
    e2e_p99_ms: float


@dataclass(frozen=True, slots=True)
class MultiRunMetrics:
    """One run of a mix: per-class metrics; `slo_attainment` is the worst class's (what goodput needs)."""

    offered_rate: float
    makespan_s: float
    output_tok_s: float
    per_class: Mapping[str, ClassMetrics]

    @property
    def slo_attainment(self) -> float:
        return min((m.attainment for m in self.per_class.values()), default=math.nan)


def class_metrics(logs: Sequence[RequestLog], classes: Mapping[str, ServiceClass]) -> dict[str, ClassMetrics]:
    out = {}
    for name, cls in classes.items():
        mine = [log for log in logs if log.service_class == name]
        if not mine:
            continue
        ttfts = [v for log in mine if (v := ttft_ms(log)) is not None]
        gaps = np.concatenate([request_gaps_ms(log) for log in mine])
        e2es = [v for log in mine if (v := e2e_ms(log)) is not None]
        out[name] = ClassMetrics(len(mine), sum(meets_class(log, cls) for log in mine) / len(mine),
                                 percentile(ttfts, 50), percentile(ttfts, 99), percentile(gaps, 99),
                                 percentile(e2es, 99))
    return out


def to_arrivals(requests: Sequence[MultiRequest], classes: Mapping[str, ServiceClass],
                tenant_weights: Mapping[str, float]) -> list[Arrival]:
    return [Arrival(r.arrival_ns, RequestSpec(r.prompt_tokens, r.output_tokens, client=r.tenant,
                                              service_class=classes[r.service_class],
                                              tenant_weight=tenant_weights.get(r.tenant, 1.0)),
                    output_len=r.output_tokens, client=r.tenant) for r in requests]


@dataclass(frozen=True)
class MultiSetup:
    """A mix ready to run: its requests at scale 1 and its resolved classes."""

    workload: MultiWorkload
    requests: tuple[MultiRequest, ...]
    classes: Mapping[str, ServiceClass]

    @property
    def base_rate(self) -> float:
        """Requests per second at scale 1."""
        return len(self.requests) / self.workload.duration_s


def prepare(workload: MultiWorkload, setup: Setup, seed: int = 0) -> MultiSetup:
    requests = tuple(build_requests(workload, seed=seed, max_context=setup.max_context))
    return MultiSetup(workload, requests, resolve_classes(workload, requests, setup))


def run_mix(scheduler: str, mix: MultiSetup, setup: Setup, *, scale: float, seed: int = 0):
    """One run of the mix at `scale` x its rates: (MultiRunMetrics, the Simulation)."""
    weights = {name: t.weight for name, t in mix.workload.tenants.items()}
    requests = rescale_requests(mix.requests, scale)
    window_ns = int(mix.workload.duration_s / scale * NS_PER_S)
    # run_workload's single SLO is unused here: the per-class SLOs are read from the logs below.
    result = run_workload(scheduler, [], setup, seed=seed, slo=SLO(math.inf, math.inf), progress=False,
                          arrivals=to_arrivals(requests, mix.classes, weights))
    sim = result.sim
    logs = list(sim.logs.values())
    return MultiRunMetrics(len(logs) / (window_ns / NS_PER_S), result.metrics.makespan_s, result.metrics.output_tok_s,
                           class_metrics(logs, mix.classes)), sim


"""One simulated serving run: a workload, a cost model, SimCore and a scheduler chosen by name.

Every scheduler runs on the same catalog, resources, cost model, warm-up and seed, so differences
between runs come from the scheduling decisions alone. docs/simulator.md describes the choices.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Sequence

import numpy as np

from helios.baselines import make_scheduler
from helios.config import PolicyConfig, SchedulerConfig, SpeculationMode, StudyConfig, preset, study_preset
from helios.engine.core import ChunkedCostModel
from helios.engine.sim_core import SimCore
from helios.errors import ConfigError
from helios.sim import profile_shape
from helios.graphs import Catalog, GraphKind, GraphShape
from helios.prepare import Capacities, build_catalog
from helios.prepare.mixed import check_prompt_rows
from helios.scheduler import RequestSpec
from helios.sim.acceptance import AcceptanceModel
from helios.sim.costmodel import CostModel, VidurCostModel
from helios.sim.loop import Arrival, Simulation
from helios.sim.metrics import NS_PER_S, SLO, RunMetrics, compute_metrics
from helios.sim.prefix_cache import PrefixCache
from helios.sim.slo_class import DEFAULT_CLASS_KEY, check_default_class, slo_table, with_default_class
from helios.sim.synthetic_cost import SyntheticCostModel
from helios.sim.traces import MOONCAKE_BLOCK_TOKENS, TraceRequest
from helios.sim.workload import load_workload, rescale

SCHEDULERS = ("helios-balanced", "helios-throughput", "helios-spec", "vllm-fcfs", "sarathi", "vtc", "direct")
# The class-aware baselines (issue 40): the multi-SLO report's defaults, never the single-class report's.
CLASS_SCHEDULERS = ("helios-balanced", "vllm-fcfs", "sarathi", "vllm-priority", "edf", "vtc")
HELIOS_SCHEDULERS = ("helios", "helios-balanced", "helios-throughput", "helios-spec", "helios-spec-table")
# helios-spec: Helios balanced with adaptive speculation (learned proposals whose acceptance follows the
# MT-Bench EAGLE curve with per-request variation). Proposal compute is not in the cost model.
# helios-spec-table: the `spec` policy preset (the spec's table as written, every study switch off).
SPEC_WIDTHS = range(1, 6)
SPEC_TOKEN_CAPACITY = 256
PACKED_BASELINES = ("vllm-fcfs", "sarathi", "vllm-priority", "edf")
COST_MODELS = ("h100-70b", "a100-70b-tp2", "a100-34b-tp2", "h100-7b", "realistic-small")


@dataclass(frozen=True)
class Setup:
    """What every scheduler in a comparison shares: cost model, catalog, resources, noise, warm-up."""

    cost_model: str = "h100-70b"
    request_slots: int = 64
    max_context: int = 8192
    page_tokens: int = 16
    prefill_chunks: tuple[int, ...] = (64, 128, 256, 512, 1024, 2048, 4096)
    noise: float = 0.03  # multiplicative timing noise of SimCore
    warmup: bool = True
    warmup_context: int = 1024  # KV length of every active row in the warm-up measurements
    mixed_prefill: bool = False  # Helios schedulers also get the mixed catalog; baselines never do
    # The mixed prompt ladder of this engine: twelve buckets per factor of four (26 up to 4096, ratio
    # ~1.12) instead of the spec example's three (10, ratio ~1.59). A prompt's last chunk pads up to its
    # bucket; at Azure load 0.9 the coarse ladder's padding cost 3-5 points of SLO attainment.
    mixed_prompt_steps: int = 12
    # Its mixed graphs carry prompt chunks of up to 1,600 tokens: a 2,560- or 4,096-token chunk riding
    # with the decoders holds them 410-690 ms on h100-70b, past the 380-ms gap SLO, and the served-stall
    # charge does not stop a long-waiting prompt's bid (1,600 against 2,048 on this engine: +0.06 req/s
    # on both traces).
    mixed_prompt_capacity: int | None = 1600
    # Rows of a mixed graph that may share its prompt capacity (docs/packed-prompt-rows.md; 1: the spec's
    # one prompt row). One: on the 1,000-request report windows, four rows raised Helios's goodput on Azure
    # (2.31 -> 2.37 req/s) and lowered it on Mooncake (0.63 -> 0.62, one seed 0.57), so the extension does
    # not pay overall (docs/packed-prompt-rows.md, "Measured"). A Helios scheduler's `mixed_prompt_rows=N`
    # variant sets it for that run; `--mixed-prompt-rows N` for every Helios row.
    mixed_prompt_rows: int = 1
    # The largest prefill graph the engine prepares, in prompt tokens (one of prefill_chunks; None or
    # above them: the largest). B x C stays within it, so 2,048 drops the 4,096-token chunk and the
    # 2 x 2,048 graph alike, each of which left every decoder out for 650 ms (docs/scheduling-utility.md
    # section 6).
    prefill_capacity: int | None = 2048
    prefix_reuse: bool = False  # automatic prefix caching by block hashes, for every scheduler alike
    prefix_cache_tokens: int | None = None  # a cap on the prefix cache (None: only the free KV pages bound it)

    def __post_init__(self) -> None:
        # Above the largest chunk it binds nothing (Setup(prefill_chunks=(64, 256)) keeps the default).
        top = self.prefill_capacity
        if top is not None and top not in self.prefill_chunks and top <= max(self.prefill_chunks):
            raise ConfigError("prefill_capacity", f"must be one of {', '.join(map(str, self.prefill_chunks))} "
                                                  f"(or above the largest), got {top!r}")
        self.capacities(mixed=True)  # Capacities checks the mixed ladder's steps and capacity

    @property
    def chunks(self) -> tuple[int, ...]:
        """The prefill chunks this engine prepares: prefill_chunks up to prefill_capacity."""
        top = max(self.prefill_chunks) if self.prefill_capacity is None else self.prefill_capacity
        return tuple(c for c in self.prefill_chunks if c <= top)  # never empty: top is one of them or above

    def capacities(self, speculation: SpeculationMode = SpeculationMode.OFF, mixed: bool = False,
                   prompt_rows: int | None = None) -> Capacities:
        # Decode at every power-of-two batch up to the slots; prefill (B, C) within one envelope (the capacity);
        # with speculation, programs of every width in SPEC_WIDTHS (ragged past R) replace ordinary decode.
        # `mixed` adds the mixed prefill+decode catalog (helios.prepare's mixed_shapes rule).
        top = self.mixed_prompt_capacity
        top = None if top is None else min(top, max(self.chunks))  # a smaller engine: its largest chunk
        rows = self.mixed_prompt_rows if prompt_rows is None else prompt_rows
        extra = {"mixed_prefill": True, "mixed_prompt_steps": self.mixed_prompt_steps,
                 "mixed_prompt_capacity": top, "mixed_prompt_rows": rows} if mixed else {}
        return Capacities(self.request_slots, self.chunks, max_prefill_tokens=max(self.chunks),
                          speculation=speculation, widths=tuple(SPEC_WIDTHS),
                          speculative_token_capacity=SPEC_TOKEN_CAPACITY, **extra)

    def catalog(self, speculation: SpeculationMode = SpeculationMode.OFF, mixed: bool = False,
                prompt_rows: int | None = None) -> Catalog:
        return build_catalog(self.capacities(speculation, mixed, prompt_rows))

    def prompt_rows_for(self, scheduler: str) -> int:
        """The mixed graphs' prompt rows of `scheduler`'s run: its `mixed_prompt_rows=N` variant, else
        the engine's `mixed_prompt_rows`."""
        return int(split_variant(scheduler)[1].get(ENGINE_FIELD, self.mixed_prompt_rows))

    def mixed_for(self, scheduler: str) -> bool:
        """Whether `scheduler` runs with the mixed catalog: Helios with --mixed-prefill. vLLM, Sarathi-Serve,
        VTC and direct keep their own rules: Helios's catalog choices are never imposed on them."""
        return self.mixed_prefill and split_variant(scheduler)[0] in HELIOS_SCHEDULERS  # variants too

    def config(self) -> SchedulerConfig:
        # Requests reserve their whole extent (prompt + max output) when first scheduled, so the page pool
        # holds every slot at full context: capacity never depends on which scheduler packs better.
        pages = self.request_slots * -(-self.max_context // self.page_tokens)
        return SchedulerConfig(request_slots=self.request_slots, kv_pages=pages, page_tokens=self.page_tokens,
                               max_context=self.max_context, selection_slots=min(64, self.request_slots))


REPAIRED = "repaired:"  # cost model name prefix: a --profile directory loaded with --profile-repair


@functools.lru_cache(maxsize=8)
def load_cost_model(name: str) -> CostModel:
    """A cost model by name: a Vidur profile (docs/cost-models.md) or "realistic-small" (synthetic)."""
    if name == "realistic-small":
        return SyntheticCostModel.realistic_small()
    # --profile DIR --profile-repair: the name carries the REPAIRED prefix (a bad cell is repaired, not an error)
    repairs, profile = ([], name[len(REPAIRED):]) if name.startswith(REPAIRED) else (None, name)
    if os.path.isdir(profile):  # --profile DIR: the user's Vidur-format attention and MLP CSVs
        return VidurCostModel.from_profile_dir(profile, repairs=repairs)
    if (shaped := profile_shape.decode(profile)) is not None:  # --profile DIR with its model shape
        directory, shape = shaped
        return VidurCostModel.from_profile_dir(directory, layers=shape.layers, overhead_ms=shape.overhead_ms,
                                               comm_us_per_token_layer=shape.comm_us, tp=shape.tp, repairs=repairs)
    if name not in COST_MODELS:
        raise ConfigError("cost_model", f"unknown cost model {name!r}; choose from {', '.join(COST_MODELS)}")
    return VidurCostModel.from_data(name)


ENGINE_FIELD = "mixed_prompt_rows"  # a variant field of the engine's catalog, not of the scheduler's configs


def split_variant(name: str) -> tuple[str, dict]:
    """"helios-balanced[stall_pricing=0,adaptation_ms=300]" -> the base name and the overrides of
    PolicyConfig or StudyConfig fields (the ablation's variants; `variant_configs` splits them), and
    `default_class=slo` (the report's SLO as the default class's targets, slo_class.py); a
    plain name has none. A `+reuse` suffix (`split_reuse`) is not part of the scheduler and is dropped.
    `mixed_prompt_rows=N` (ENGINE_FIELD) sets that run's catalog instead (`Setup.prompt_rows_for`)."""
    name = split_reuse(name)[0]
    if not name.endswith("]") or "[" not in name:
        return name, {}
    base, _, body = name[:-1].partition("[")
    defaults = {**{f.name: getattr(PolicyConfig(), f.name) for f in dataclasses.fields(PolicyConfig)},
                **{f.name: getattr(StudyConfig(), f.name) for f in dataclasses.fields(StudyConfig)},
                ENGINE_FIELD: 1}
    overrides = {}
    for item in filter(None, body.split(",")):
        key, eq, text = item.partition("=")
        if eq and key == DEFAULT_CLASS_KEY:  # not a config field: the class table of the run (slo_class.py)
            overrides[key] = check_default_class(text, name)
            continue
        if not eq or key not in defaults:
            raise ConfigError("scheduler", f"bad variant {item!r} in {name!r}: use field=value with a "
                              f"PolicyConfig or StudyConfig field, or {ENGINE_FIELD}")
        default = defaults[key]
        if isinstance(default, bool):
            overrides[key] = text.lower() in ("1", "true", "on", "yes")
        elif isinstance(default, Enum):
            overrides[key] = text  # the config takes the value and names the choices when it is wrong
        elif text.lower() in ("none", "off"):
            overrides[key] = None
        else:
            try:
                overrides[key] = float(text)
            except ValueError:
                raise ConfigError("scheduler", f"bad variant {item!r} in {name!r}: {text!r} is not a number") from None
    if ENGINE_FIELD in overrides:
        rows = overrides[ENGINE_FIELD]
        if rows is None or rows != int(rows):
            raise ConfigError("scheduler", f"bad variant in {name!r}: {ENGINE_FIELD} is a whole number of rows")
        overrides[ENGINE_FIELD] = int(rows)
        check_prompt_rows(overrides[ENGINE_FIELD])
    return base, overrides


def variant_configs(name: str) -> tuple[PolicyConfig, StudyConfig]:
    """A Helios report name's preset (helios-throughput: throughput; helios-spec-table: the spec's
    table; else balanced) with its variant overrides, split between PolicyConfig and StudyConfig."""
    base, overrides = split_variant(name)
    policy = "throughput" if base.endswith("throughput") else "spec" if base == "helios-spec-table" else "balanced"
    study_fields = {f.name for f in dataclasses.fields(StudyConfig)}
    overrides.pop(ENGINE_FIELD, None)  # the catalog's, not the scheduler's (Setup.prompt_rows_for)
    overrides.pop(DEFAULT_CLASS_KEY, None)
    return (replace(preset(policy), **{k: v for k, v in overrides.items() if k not in study_fields}),
            replace(study_preset(policy), **{k: v for k, v in overrides.items() if k in study_fields}))


REUSE_SUFFIX = "+reuse"


def split_reuse(name: str) -> tuple[str, bool]:
    """"vllm-fcfs+reuse" -> ("vllm-fcfs", True): the report's prefix-reuse rows are the same scheduler
    run with the automatic prefix cache (`Setup.prefix_reuse`)."""
    if name.endswith(REUSE_SUFFIX):
        return name[: -len(REUSE_SUFFIX)], True
    return name, False


def prefix_cache_for(setup: Setup, scheduler: str) -> PrefixCache | None:
    """The prefix cache of one run, or None when reuse is off. Every scheduler gets the same one: blocks
    of the trace's size, bounded by the free pages of the same KV pool (and `prefix_cache_tokens`)."""
    if not (setup.prefix_reuse or split_reuse(scheduler)[1]):
        return None
    cap = None if setup.prefix_cache_tokens is None else setup.prefix_cache_tokens // MOONCAKE_BLOCK_TOKENS
    return PrefixCache(MOONCAKE_BLOCK_TOKENS, cap, page_tokens=setup.page_tokens)


def build_scheduler(name: str, catalog: Catalog, config: SchedulerConfig):
    """A scheduler by report name: helios-balanced, helios-throughput (or helios), a Helios variant
    (`split_variant`), or a baseline; a `+reuse` suffix (prefix reuse) changes only the run."""
    full = name
    name, overrides = split_variant(name)
    if name in HELIOS_SCHEDULERS:
        policy, study = variant_configs(full)
        return make_scheduler("helios", catalog, policy, config, study=study)
    if overrides:
        raise ConfigError("scheduler", f"policy variants apply to Helios only, not {name!r}")
    # vLLM and Sarathi-Serve run each iteration as one packed varlen forward; SimCore can run that.
    return make_scheduler(name, catalog, None, config, **({"packed": True} if name in PACKED_BASELINES else {}))


def solo_prefill_ns(model: CostModel, catalog: Catalog, prompt: int) -> int:
    """Time to prefill one prompt alone: the smallest single-row chunk that covers what is left, else the
    largest chunk, repeated over the growing context."""
    chunks = sorted(s.token_capacity for s in catalog.of_kind(GraphKind.PREFILL) if s.batch_capacity == 1)
    done, total = 0, 0
    while done < prompt:
        c = next((c for c in chunks if c >= prompt - done), chunks[-1])
        total += model.duration_ns(GraphShape(GraphKind.PREFILL, 1, c), [done])
        done += c
    return total


def decode_ns(model: CostModel, batch: int, context: int) -> int:
    return model.duration_ns(GraphShape(GraphKind.DECODE, batch), [context] * batch)


def setup_from_flags(**fields) -> Setup:
    """A Setup from command-line values, where None means the flag was not given (keep the default)."""
    return Setup(**{k: v for k, v in fields.items() if v is not None})


def workload_catalog(setup: Setup) -> Catalog:
    # Load and SLOs measure the workload, so they use every prefill chunk whatever the engine prepares:
    # a --prefill-capacity run is held to the same SLOs at the same loads as the report it is compared with.
    return replace(setup, prefill_capacity=None).catalog()


def nominal_load(requests: Sequence[TraceRequest], window_ns: int, setup: Setup) -> float:
    """Device-seconds of work offered per second: each prompt prefilled alone, each output token at its
    share of a full decode batch. Saturation sets in somewhat below 1: batches are not always full."""
    model, catalog = load_cost_model(setup.cost_model), workload_catalog(setup)
    b = setup.request_slots
    work = sum(solo_prefill_ns(model, catalog, r.prompt_tokens)
               + r.output_tokens * decode_ns(model, b, r.prompt_tokens + r.output_tokens // 2) / b
               for r in requests)
    return work / window_ns


def default_slo(requests: Sequence[TraceRequest], setup: Setup, ttft_scale: float = 5.0,
                gap_scale: float = 10.0) -> SLO:
    """DistServe-style SLOs scaled to the model: TTFT <= ttft_scale x the solo prefill of the workload's
    90th-percentile prompt; each request's p99 gap <= gap_scale x a batch-1 decode at the median context.

    The p90 prompt (not the median) keeps the SLO reachable for long prompts in mixed workloads; the gap
    SLO at 10 decode steps leaves room for one prefill chunk of up to ~2k tokens between two decodes.
    """
    model, catalog = load_cost_model(setup.cost_model), workload_catalog(setup)
    p = int(np.percentile([r.prompt_tokens for r in requests], 90))
    ctx = int(np.median([r.prompt_tokens + r.output_tokens // 2 for r in requests]))
    return SLO(ttft_ms=ttft_scale * solo_prefill_ns(model, catalog, p) / 1e6,
               gap_ms=gap_scale * decode_ns(model, 1, ctx) / 1e6)


def warm_up(scheduler, catalog: Catalog, model: CostModel, context: int) -> None:
    """Measure every graph once before the trace, as the spec's discovery would, but off the clock: one
    full-occupancy sample per shape (decode rows at `context`, prefill with nothing cached) at t=0."""
    def full(shape) -> list[int]:
        ctx = context if shape.kind in (GraphKind.DECODE, GraphKind.SPECULATIVE, GraphKind.MIXED) else 0
        return [ctx] * shape.batch_capacity

    def sample(shape) -> int:
        if shape.kind is GraphKind.MIXED and isinstance(model, ChunkedCostModel):
            # A full prompt row over nothing cached, every other row decoding at `context`.
            rows = shape.batch_capacity - 1
            return model.chunked_duration_ns(shape, [shape.prefill_capacity] + [0] * rows, [0] + [context] * rows)
        return model.duration_ns(shape, full(shape))

    scheduler.seed_costs({shape: [sample(shape)] for shape in catalog}, 0)


def to_arrivals(requests: Sequence[TraceRequest]) -> list[Arrival]:
    return [Arrival(r.arrival_ns, RequestSpec(r.prompt_tokens, r.output_tokens, client=r.client),
                    output_len=r.output_tokens, client=r.client, prefix_blocks=r.prefix_blocks) for r in requests]


@dataclass
class RunResult:
    scheduler: str
    scale: float
    metrics: RunMetrics
    sim: Simulation = field(repr=False)


def run_workload(scheduler: str, requests: Sequence[TraceRequest], setup: Setup, *, seed: int = 0,
                 slo: SLO, arrival_window_ns: int | None = None, progress: bool | None = None,
                 scale: float = 1.0, decisions=None, arrivals: Sequence[Arrival] | None = None) -> RunResult:
    """Simulate `requests` (already at their final rate) to completion; deterministic given `seed`.
    decisions: a DecisionLog (helios.runtime.decisions); the run's decisions are then in sim.decision_log.
    `arrivals` replaces them with ready-made ones (requests with classes and tenants, class_metrics.py).

    progress: a tqdm bar over virtual time; None shows it only when stderr is a terminal.
    """
    speculation = SpeculationMode.ADAPTIVE if split_variant(scheduler)[0] == "helios-spec" else SpeculationMode.OFF
    catalog = setup.catalog(speculation, setup.mixed_for(scheduler), setup.prompt_rows_for(scheduler))
    config = replace(setup.config(), speculation=speculation)
    acceptance = AcceptanceModel(seed=seed) if speculation is SpeculationMode.ADAPTIVE else None
    model = load_cost_model(setup.cost_model)
    sched = build_scheduler(scheduler, catalog, config)
    if setup.warmup:
        warm_up(sched, catalog, model, setup.warmup_context)
    core = SimCore(catalog, model, seed=seed, noise=setup.noise, acceptance=acceptance,
                   request_slots=config.request_slots, draft_capacity=config.draft_capacity)
    bar = _bar(requests, progress, scheduler)
    last = [0]

    def tick(step) -> None:
        bar.update((step.end_ns - last[0]) / NS_PER_S)
        last[0] = step.end_ns

    sim = Simulation(sched, core, on_step=tick if bar is not None else None,
                     prefix_cache=prefix_cache_for(setup, scheduler), decisions=decisions)
    if split_variant(scheduler)[1].get(DEFAULT_CLASS_KEY) is not None:
        if arrivals is not None:
            raise ConfigError("scheduler", f"{scheduler!r}: default_class=slo is for single-class traces; "
                                           f"this workload's requests already carry their classes")
        arrivals = with_default_class(to_arrivals(requests), slo_table(slo))
    sim.add(to_arrivals(requests) if arrivals is None else arrivals)
    try:
        sim.run()
    finally:
        if bar is not None:
            bar.close()
    return RunResult(scheduler, scale, compute_metrics(sim, slo, arrival_window_ns=arrival_window_ns), sim)


def run_trace(scheduler: str, trace: str, *, window_s: float, scale: float, setup: Setup, seed: int = 0,
              slo: SLO | None = None, progress: bool | None = None) -> RunResult:
    """`run_workload` on the first `window_s` seconds of `trace` at `rate_scale = scale`; the SLO defaults
    to `default_slo` of the window."""
    base = load_workload(trace, window_s, seed=seed, max_context=setup.max_context)
    slo = slo or default_slo(base, setup)
    return run_workload(scheduler, rescale(base, scale), setup, seed=seed, slo=slo, scale=scale,
                        arrival_window_ns=int(window_s / scale * NS_PER_S), progress=progress)


def _bar(requests, progress: bool | None, label: str):
    if progress is None:
        progress = sys.stderr.isatty()
    if not progress or not requests:
        return None
    from tqdm import tqdm

    total = round(max(r.arrival_ns for r in requests) / NS_PER_S, 1)
    return tqdm(total=total, desc=label, unit="vs", leave=False, bar_format="{l_bar}{bar}| {n:.0f}/{total:.0f} vs")

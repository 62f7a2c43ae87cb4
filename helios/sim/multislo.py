"""The multi-SLO workload: application streams, each with its own trace, arrival process, class and
tenant, and each class with its own SLO (issue 40; docs/simulator.md, "Multi-SLO workload").

A workload names streams (a trace, a class, a tenant and a rate in requests/s at scale 1) and classes
(targets, weight, priority). A class's targets are given in milliseconds (`ttft_ms`, ...) or, in the
DistServe style, scaled to the cost model (`ttft_scale`, ...), resolved on the requests of that class:

    ttft_scale            x the solo prefill of the class's 90th-percentile prompt
    ttft_per_token_scale  x that solo prefill per prompt token (a target that grows with the prompt)
    gap_scale             x one batch-1 decode step at the class's median context
    deadline_scale        x the solo end-to-end time of the class's p90 prompt and p90 output

`SHARED` is the built-in mix; `load_workload_file` reads a user's TOML or JSON file of the same shape.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence

import numpy as np

from helios.class_table import read_toml_or_json
from helios.errors import ConfigError
from helios.scheduler.service_class import Tenant
from helios.sim.metrics import NS_PER_S
from helios.sim.traces import TraceRequest, sharegpt_poisson
from helios.sim.workload import whole_trace

STREAM_TRACES = ("azure", "mooncake", "sharegpt")
TARGETS = ("ttft", "ttft_per_token", "gap", "deadline")


@dataclass(frozen=True, slots=True)
class Stream:
    """One application: requests from `trace` at `rate` requests/s (at scale 1), of `service_class`,
    paid for by `tenant`. Azure and Mooncake keep their own arrival process (time-scaled to the rate);
    ShareGPT lengths arrive as a gamma process of `burstiness` (1: Poisson)."""

    name: str
    trace: str
    service_class: str
    rate: float
    tenant: str = ""
    burstiness: float = 1.0

    def __post_init__(self) -> None:
        if not self.tenant:
            object.__setattr__(self, "tenant", self.name)


@dataclass(frozen=True, slots=True)
class ClassSpec:
    """A class as a workload states it: each target in ms (`ms`) or as a multiple of the cost model's
    reference (`scale`); `resolve` turns it into a ServiceClass in ms."""

    name: str
    ms: Mapping[str, float] = field(default_factory=dict)
    scale: Mapping[str, float] = field(default_factory=dict)
    weight: float = 1.0
    priority: int = 0


@dataclass(frozen=True)
class MultiWorkload:
    streams: tuple[Stream, ...]
    classes: Mapping[str, ClassSpec]
    tenants: Mapping[str, Tenant] = field(default_factory=dict)
    duration_s: float = 120.0  # of arrivals at scale 1
    target: float = 0.9  # a class attains its SLO when this fraction of its requests meets it


@dataclass(frozen=True, slots=True)
class MultiRequest:
    """A request of the mix: its trace lengths, class and tenant."""

    arrival_ns: int
    prompt_tokens: int
    output_tokens: int
    tenant: str
    service_class: str


def _number(value: Any, where: str, positive: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or (positive and value <= 0):
        raise ConfigError(where, f"must be a {'positive ' if positive else ''}number, got {value!r}")
    return float(value)


def _keys(body: Any, allowed: set[str], where: str, sep: str = ".") -> Mapping:
    if not isinstance(body, Mapping):
        raise ConfigError(where, "must be a table/object")
    bad = sorted(set(body) - allowed)
    if bad:
        raise ConfigError(f"{where}{sep}{bad[0]}", f"unknown key; expected {', '.join(sorted(allowed))}")
    return body


def workload_from_mapping(data: Any, source: str = "workload") -> MultiWorkload:
    """A MultiWorkload from parsed TOML/JSON; a ConfigError names `source` and the field."""
    data = _keys(data, {"duration_s", "target", "streams", "classes", "tenants"}, source, ": ")
    classes = {}
    class_keys = {f"{t}_{u}" for t in TARGETS for u in ("ms", "scale")} | {"weight", "priority"}
    raw = data.get("classes")
    if not isinstance(raw, Mapping) or not raw:
        raise ConfigError(f"{source}: classes", "must be a nonempty table of classes by name")
    for name, body in raw.items():
        where = f"{source}: classes.{name}"
        body = _keys(body, class_keys, where)
        ms, scale = {}, {}
        for t in TARGETS:
            if f"{t}_ms" in body and f"{t}_scale" in body:
                raise ConfigError(f"{where}.{t}_ms", f"give {t}_ms or {t}_scale, not both")
            if f"{t}_ms" in body:
                ms[t] = _number(body[f"{t}_ms"], f"{where}.{t}_ms")
            if f"{t}_scale" in body:
                scale[t] = _number(body[f"{t}_scale"], f"{where}.{t}_scale")
        if not ms and not scale:
            raise ConfigError(where, "a class of a multi-SLO workload needs at least one target")
        priority = body.get("priority", 0)
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise ConfigError(f"{where}.priority", f"must be an integer, got {priority!r}")
        classes[name] = ClassSpec(name, ms, scale, _number(body.get("weight", 1.0), f"{where}.weight"), priority)
    streams = []
    raw = data.get("streams")
    if not isinstance(raw, list) or not raw:
        raise ConfigError(f"{source}: streams", "must be a nonempty list of streams")
    for i, body in enumerate(raw):
        where = f"{source}: streams[{i}]"
        body = _keys(body, {"name", "trace", "class", "rate", "tenant", "burstiness"}, where)
        for key in ("name", "trace", "class", "rate"):
            if key not in body:
                raise ConfigError(f"{where}.{key}", "missing")
        trace = body["trace"]
        if not isinstance(trace, str) or not (trace in STREAM_TRACES or trace.partition(":")[0] in ("azure", "mooncake")):
            raise ConfigError(f"{where}.trace", f"must be one of {', '.join(STREAM_TRACES)}, or azure:PATH / "
                                                f"mooncake:PATH, got {trace!r}")
        if body["class"] not in classes:
            raise ConfigError(f"{where}.class", f"unknown class {body['class']!r}; classes: {', '.join(classes)}")
        if not isinstance(body["name"], str) or not body["name"]:
            raise ConfigError(f"{where}.name", f"must be a nonempty string, got {body['name']!r}")
        tenant = body.get("tenant", body["name"])
        if not isinstance(tenant, str) or not tenant:
            raise ConfigError(f"{where}.tenant", f"must be a nonempty string, got {tenant!r}")
        streams.append(Stream(body["name"], trace, body["class"], _number(body["rate"], f"{where}.rate"), tenant,
                              _number(body.get("burstiness", 1.0), f"{where}.burstiness")))
    if len({s.name for s in streams}) != len(streams):
        raise ConfigError(f"{source}: streams", "stream names must be unique")
    tenants = {}
    raw = data.get("tenants", {})
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{source}: tenants", "must be a table of tenants by name")
    for name, body in raw.items():
        body = _keys(body, {"weight"}, f"{source}: tenants.{name}")
        tenants[name] = Tenant(name, _number(body.get("weight", 1.0), f"{source}: tenants.{name}.weight"))
    target = _number(data.get("target", 0.9), f"{source}: target")
    if target > 1:
        raise ConfigError(f"{source}: target", f"must be a fraction in (0, 1], got {target}")
    return MultiWorkload(tuple(streams), classes, tenants,
                         _number(data.get("duration_s", 120.0), f"{source}: duration_s"), target)


def load_workload_file(path: str | os.PathLike[str]) -> MultiWorkload:
    """A workload file (`flare sim report --workload PATH`): TOML by a .toml suffix, else JSON."""
    return workload_from_mapping(read_toml_or_json(path, "workload"), os.fspath(path))


# The shared multi-SLO workload (docs/simulator.md explains each choice). Rates at scale 1 put about one
# device-second of work per second on h100-70b.
SHARED_MAPPING = {
    "duration_s": 120.0,
    "classes": {
        # The priority tier: chat for paying users, a tighter first token.
        "premium": {"ttft_scale": 2.0, "gap_scale": 10.0, "weight": 8.0, "priority": 0},
        "chat": {"ttft_scale": 3.0, "gap_scale": 10.0, "weight": 4.0, "priority": 1},
        # Long prompts: a first-token target that grows with the prompt, a loose stream.
        "summarize": {"ttft_per_token_scale": 4.0, "gap_scale": 25.0, "weight": 2.0, "priority": 2},
        "batch": {"deadline_scale": 4.0, "weight": 1.0, "priority": 3},
    },
    "streams": [
        {"name": "premium", "trace": "azure", "class": "premium", "rate": 0.4},
        {"name": "chat", "trace": "azure", "class": "chat", "rate": 1.2},
        {"name": "summarize", "trace": "mooncake", "class": "summarize", "rate": 0.2},
        {"name": "batch", "trace": "sharegpt", "class": "batch", "rate": 1.0},
    ],
}
SHARED = workload_from_mapping(SHARED_MAPPING, "shared multi-SLO workload")
BUILTIN_WORKLOADS = {"shared": SHARED}


def workload_named(name_or_path: str) -> MultiWorkload:
    """A built-in workload by name (`shared`) or a workload file."""
    found = BUILTIN_WORKLOADS.get(name_or_path)
    return found if found is not None else load_workload_file(name_or_path)


def _trace_stream(stream: Stream, duration_s: float, rng: np.random.Generator,
                  max_context: int) -> list[TraceRequest]:
    """rate x duration consecutive requests of the trace from a random start, their arrival times scaled
    so that they span the window: the stream keeps the trace's own burstiness at its own rate."""
    everything = whole_trace(stream.trace, max_context=max_context)
    n = min(len(everything), max(2, round(stream.rate * duration_s)))
    start = int(rng.integers(0, len(everything) - n + 1))
    picked = everything[start:start + n]
    t0 = picked[0].arrival_ns
    span = max(picked[-1].arrival_ns - t0, 1)
    window_ns = duration_s * NS_PER_S * (n - 1) / n  # the last arrival one mean gap before the end
    return [replace(r, arrival_ns=int(round((r.arrival_ns - t0) * window_ns / span)), prefix_blocks=())
            for r in picked]


def build_requests(workload: MultiWorkload, *, seed: int = 0, max_context: int = 8192) -> list[MultiRequest]:
    """Every stream's requests over `duration_s` at scale 1, merged in arrival order (ties by stream)."""
    out: list[tuple[int, int, MultiRequest]] = []
    for index, s in enumerate(workload.streams):
        rng = np.random.default_rng([seed, index])  # each stream its own draws: adding one changes no other
        if s.trace == "sharegpt":
            n = max(1, round(s.rate * workload.duration_s * 1.5))
            reqs = [r for r in sharegpt_poisson(s.rate, n, seed=int(rng.integers(2**31)), burstiness=s.burstiness,
                                                max_context=max_context)
                    if r.arrival_ns < workload.duration_s * NS_PER_S]
        else:
            reqs = _trace_stream(s, workload.duration_s, rng, max_context)
        out += [(r.arrival_ns, index, MultiRequest(r.arrival_ns, r.prompt_tokens, r.output_tokens, s.tenant,
                                                   s.service_class)) for r in reqs]
    return [m for _, _, m in sorted(out, key=lambda e: (e[0], e[1]))]


def rescale_requests(requests: Sequence[MultiRequest], scale: float) -> list[MultiRequest]:
    """The same requests arriving `scale` times as fast."""
    if not scale > 0:
        raise ConfigError("scale", f"must be positive, got {scale}")
    return [replace(r, arrival_ns=int(round(r.arrival_ns / scale))) for r in requests]


def deadline_only(workload: MultiWorkload) -> set[str]:
    """The classes that state a completion deadline and no first-token or gap target (batch)."""
    return {name for name, c in workload.classes.items() if set(c.ms) | set(c.scale) <= {"deadline"}}


def without_deadline_only(workload: MultiWorkload) -> MultiWorkload:
    """The mix without its deadline-only classes and their streams (bench/multislo_headroom.py: what
    the classes with first-token or gap targets allow by themselves); a ConfigError when nothing is left."""
    drop = deadline_only(workload)
    streams = tuple(s for s in workload.streams if s.service_class not in drop)
    if not streams:
        raise ConfigError("workload", "every stream is deadline-only: nothing left to measure")
    if workload.streams[:len(streams)] != streams:
        # Each stream's draws follow its position (build_requests), so the kept streams must keep theirs.
        raise ConfigError("workload", "list the deadline-only streams after the others: each stream draws its "
                                      "requests by its position, so removing an earlier one would change the rest")
    return replace(workload, streams=streams, classes={k: v for k, v in workload.classes.items() if k not in drop})

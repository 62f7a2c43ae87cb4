"""Prometheus metrics of one server, in a private registry.

Scheduler and runtime counters are read at scrape time by a custom collector from one
`Runtime.snapshot()` (the scheduler's SchedulerSnapshot and the runtime's counters, copied under
the runtime's lock), so one scrape sees one consistent state (executions and nanoseconds
of the same frames, slots and requests of the same instant). Per-request latencies are pushed
into histograms when a stream ends.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from helios.runtime.stream import RequestStream
from helios.server.class_metrics import ClassMetrics

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0, 30.0)

_SPECULATIVE = (  # metric name, SchedulerSnapshot.speculative key, help
    ("programs", "programs", "complete speculative programs executed"),
    ("offered_tokens", "offered", "draft positions offered for verification"),
    ("accepted_tokens", "accepted", "draft positions accepted"),
    ("emitted_tokens", "emitted", "tokens committed by speculative programs (bonus included)"),
    ("learned_draws", "learned_draws", "learned-proposal draws (copy proposals draw none)"),
)


class ServerMetrics:
    """The registry, the request histograms and counters, and the scheduler collector."""

    def __init__(self):
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        self.ttft = Histogram("flare_time_to_first_token_seconds", "submission to first visible output",
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.inter_token = Histogram(
            "flare_inter_token_latency_seconds",
            "gap between consecutive visible publications of a stream (a speculative burst is one)",
            buckets=_LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram("flare_request_duration_seconds", "submission to the end of the stream",
                             buckets=_LATENCY_BUCKETS, registry=r)
        self.finished = Counter("flare_requests_finished", "requests that ended, by finish reason",
                                ["finish_reason"], registry=r)
        self.rejected = Counter("flare_requests_rejected", "requests answered with an error before admission",
                                ["reason"], registry=r)
        self.by_class = ClassMetrics(r, _LATENCY_BUCKETS)  # the same, labelled by service class

    def attach(self, runtime) -> None:
        self.registry.register(_RuntimeCollector(runtime))

    def observe(self, stream: RequestStream) -> None:
        """Record an ended stream (runs on the runtime thread: keep it cheap)."""
        m = stream.metrics
        if m.ttft_ns is not None:
            self.ttft.observe(m.ttft_ns / 1e9)
        for gap in m.gaps_ns:
            self.inter_token.observe(gap / 1e9)
        if m.finished_ns is not None:
            self.e2e.observe(max(0, m.finished_ns - m.submitted_ns) / 1e9)
        self.finished.labels(stream.finish_reason or "unknown").inc()
        self.by_class.observe(stream)

    def render(self) -> bytes:
        return generate_latest(self.registry)


def _per_graph(family, values) -> None:
    """Add one sample per prepared graph, labelled by its kind and shape label."""
    for label, n in sorted(values):
        family.add_metric([label.split("[", 1)[0], label], n)


class _RuntimeCollector:
    def __init__(self, runtime):
        self.runtime = runtime

    def collect(self):
        snap, stats = self.runtime.snapshot()  # one consistent state per scrape
        ns = CounterMetricFamily("flare_scheduler_execution_nanoseconds",
                                 "measured execution time by execution class", labels=["class"])
        ex = CounterMetricFamily("flare_scheduler_executions", "executions by execution class", labels=["class"])
        for cls, value in snap.nanoseconds.items():
            ns.add_metric([cls], value)
            ex.add_metric([cls], snap.executions[cls])
        yield ns
        yield ex
        for name, key, doc in _SPECULATIVE:
            yield CounterMetricFamily(f"flare_speculative_{name}", doc, value=snap.speculative.get(key, 0))
        graphs = CounterMetricFamily("flare_graph_executions", "completed executions by graph kind and shape",
                                     labels=["kind", "shape"])
        _per_graph(graphs, ((sh.label(), n) for sh, n in snap.by_shape.items()))
        yield graphs
        wall = CounterMetricFamily("flare_graph_wall_nanoseconds",
                                   "dispatch-to-completion host time by graph kind and shape",
                                   labels=["kind", "shape"])
        _per_graph(wall, stats.wall_ns_by_shape.items())
        yield wall
        est = GaugeMetricFamily("flare_graph_estimated_duration_nanoseconds",
                                "the scheduler's current duration estimate of each measured graph",
                                labels=["kind", "shape"])
        _per_graph(est, ((sh.label(), n) for sh, n in snap.estimates_ns.items()))
        yield est
        yield GaugeMetricFamily("flare_requests_running", "live requests holding a request slot", value=snap.running)
        yield GaugeMetricFamily("flare_requests_waiting", "live requests waiting for a request slot",
                                value=snap.waiting)
        yield GaugeMetricFamily("flare_request_slots_free", "free request slots", value=snap.free_slots)
        yield GaugeMetricFamily("flare_request_slots", "request slots", value=snap.total_slots)
        yield GaugeMetricFamily("flare_kv_pages_free", "free KV-cache pages", value=snap.free_pages)
        yield GaugeMetricFamily("flare_kv_pages", "KV-cache pages", value=snap.total_pages)
        for name, times, doc in (
                ("flare_scheduler_decision_seconds", stats.decisions,
                 "host time of the scheduler's decision for each dispatched frame (plan and commit)"),
                ("flare_frame_completion_seconds", stats.completions,
                 "host time to complete each frame: the scheduler's completion, detokenizing and publishing")):
            yield HistogramMetricFamily(name, doc, buckets=times.cumulative(), sum_value=times.total_ns / 1e9)
        yield CounterMetricFamily("flare_engine_faults", "frames that failed in the engine", value=stats.faults)
        yield CounterMetricFamily("flare_requests_submitted", "requests admitted to the runtime",
                                  value=stats.submitted)
        # Token counters move as tokens are produced (a 2,000-token request shows progress while it runs).
        yield CounterMetricFamily("flare_prompt_tokens", "prompt tokens of admitted requests (counted at admission)",
                                  value=stats.prompt_tokens)
        yield CounterMetricFamily("flare_generation_tokens", "tokens generated, counted as they are published "
                                  "(cancelled requests' tokens included)", value=stats.generated_tokens)
        yield from _checkpoint_metrics(snap, getattr(self.runtime.core, "checkpoints", None))
        torch_thread = getattr(self.runtime.core, "torch_thread", None)
        if torch_thread is not None:  # the CPU engine's thread count (helios.engine.cpu_threads)
            yield GaugeMetricFamily("flare_engine_cpu_threads", "torch threads the CPU engine runs with now "
                                    "(fewer while other processes use the CPUs)", value=torch_thread.threads)


_CHECKPOINT = (  # metric name, CheckpointStats field, help
    ("hits", "hits", "chat admissions that matched a stored checkpoint prefix"),
    ("misses", "misses", "chat admissions that matched no stored checkpoint"),
    ("evictions", "evictions", "checkpoints evicted by the allocator's rule to make room"),
    ("restored_tokens", "restored_tokens", "prompt tokens restored instead of prefilled"),
    ("skipped_snapshots", "skipped_snapshots", "snapshot copies skipped: no room even after eviction"),
)


def _checkpoint_metrics(snap, store):
    """flare_checkpoint_*: the core's store counters (read without its lock: plain counters, a
    scrape may see one copy half counted) and the scheduler's snapshot/restore executions."""
    for name, key, doc in _CHECKPOINT:
        yield CounterMetricFamily(f"flare_checkpoint_{name}", doc, value=getattr(store.stats, key) if store else 0)
    runs = {"snapshot": 0, "restore": 0}
    for shape, n in snap.by_shape.items():
        if shape.kind.value in runs:
            runs[shape.kind.value] += n
    for kind, n in runs.items():
        yield CounterMetricFamily(f"flare_checkpoint_{kind}_executions", f"completed {kind} graphs", value=n)
    if store is not None:
        yield GaugeMetricFamily("flare_checkpoint_bytes", "host memory held by stored checkpoints",
                                value=store.used_bytes)
        yield GaugeMetricFamily("flare_checkpoint_capacity_bytes", "the checkpoint store's bound (--checkpoint-memory)",
                                value=store.capacity_bytes)

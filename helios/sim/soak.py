"""A simulated soak: many random requests through the runtime on SimCore, with cancellations and
injected core faults, checked against what an uninterrupted run must publish.

Tokens come from `KeyedSimCore`: each request's n-th token is a function of its prompt and n
only, so the output an uninterrupted run would publish is known exactly, whatever the batching,
order or faults around it. Every request must end completed, cancelled or failed with a
reason (none lost); a completed one must publish exactly the expected text and tokens, and a
cancelled or failed one a prefix of them. Afterwards every slot and page is free, the core
holds no request, and the runtime is idle. Shared by tests (a short run) and
bench/reliability.py (10,000 requests).
"""

from __future__ import annotations

import dataclasses
import random
import threading
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from helios.config import SchedulerConfig
from helios.runtime.runtime import Runtime
from helios.engine.sim_core import SimCore, SimFaults
from helios.graphs import GraphKind
from helios.prepare import ordinary_catalog
from helios.scheduler import Scheduler

EOS = 256  # outside the byte range: never decodes to text
ALPHABET = 26  # tokens are lowercase ASCII letters, so stop strings of letters really occur


def token_at(key: int, n: int) -> int:
    """The n-th output token (0-based) of a request whose prompt hashes to `key`."""
    return ord("a") + (key * 7919 + n * n * 31 + n * 17) % ALPHABET


class KeyedSimCore(SimCore):
    """SimCore whose tokens depend only on the request's prompt and position (timing, faults and
    EOS placement stay SimCore's); `attached` counts requests the core still holds."""

    def __init__(self, catalog, cost_model, **kw):
        super().__init__(catalog, cost_model, eos_id=EOS, **kw)
        self._keys: dict[int, tuple[int, int]] = {}  # handle -> (prompt key, tokens emitted)

    @property
    def attached(self) -> int:
        return len(self._keys)

    def attach(self, handle, prompt=0, **options) -> None:
        super().attach(handle, prompt, **options)
        self._keys[handle] = (prompt_key(prompt), 0)

    def detach(self, handle) -> None:
        super().detach(handle)
        self._keys.pop(handle, None)

    def execute(self, plan, fence):
        execution = super().execute(plan, fence)
        return dataclasses.replace(execution, records=tuple(self._rekey(r) for r in execution.records))

    def _rekey(self, record):
        key, n = self._keys.get(record.handle, (0, 0))
        body = len(record.tokens) - (1 if record.eos else 0)
        tokens = tuple(token_at(key, n + i) for i in range(body)) + ((EOS,) if record.eos else ())
        self._keys[record.handle] = (key, n + body)
        return dataclasses.replace(record, tokens=tokens)


def prompt_key(prompt) -> int:
    ids = [prompt] if isinstance(prompt, int) else list(prompt)
    return zlib.crc32(bytes(i % 256 for i in ids))


class LetterTokenizer:
    """Token id = byte value; EOS (256) decodes to nothing."""

    def decode(self, ids) -> str:
        return bytes(i for i in ids if i < 256).decode("ascii", errors="replace")


class _AffineCost:
    def duration_ns(self, shape, context_lens) -> int:
        b = shape.batch_capacity
        ms = 2 + 0.05 * b if shape.kind is GraphKind.DECODE else 2 + 0.01 * b * shape.token_capacity
        return int(ms * 1e6)


@dataclass(frozen=True, slots=True)
class SoakConfig:
    """One soak run: how many requests, how they look, and what goes wrong."""

    requests: int = 10_000
    concurrency: int = 16  # client threads, each with one request in flight
    slots: int = 8
    max_prompt: int = 200
    max_tokens: int = 48
    stop_rate: float = 0.25  # requests with stop strings
    eos_rate: float = 0.3  # requests whose core emits EOS before max_tokens
    cancel_rate: float = 0.10
    fault_rate: float = 0.01  # frames that raise in the core
    raise_every: int | None = None  # also every Nth frame raises (a fault storm)
    missing_timing: float = 0.0  # frames whose ranks all report no interval
    zero_timing: float = 0.0  # frames whose ranks all report 0
    ranks: int = 1
    rank_disagreement: float = 0.0  # frames where one rank past rank 0 reports None, 0 or 2-10x
    seed: int = 0
    rss_every: int = 1000  # sample the process RSS every this many finished requests
    deadline_s: float = 1800.0  # the whole run; a request that outlives it counts as lost

    def __post_init__(self) -> None:
        for name in ("requests", "concurrency", "slots", "max_prompt", "max_tokens", "rss_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        for name in ("stop_rate", "eos_rate", "cancel_rate", "fault_rate", "missing_timing", "zero_timing",
                     "rank_disagreement"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1]")


@dataclass(slots=True)
class SoakReport:
    """The figures of one soak: outcomes, violations, leaks and memory."""

    requests: int = 0
    outcomes: dict = field(default_factory=dict)  # finish_reason -> requests
    lost: int = 0  # no end, or an end without a reason
    mismatched: list = field(default_factory=list)  # (request index, why)
    frame_faults: int = 0
    frames: int = 0  # frames that completed (faulted ones excluded)
    measured_graphs: int = 0  # graphs with a duration estimate at the end
    min_estimate_ns: int | None = None
    leaked_slots: int = 0
    leaked_pages: int = 0
    core_attached: int = 0  # requests the core still holds after the run
    idle: bool = False
    rss_kb: list = field(default_factory=list)  # (finished requests, VmRSS kB)
    wall_s: float = 0.0

    @property
    def ok(self) -> bool:
        return (self.lost == 0 and not self.mismatched and self.leaked_slots == 0 and self.leaked_pages == 0
                and self.core_attached == 0 and self.idle)


@dataclass(frozen=True, slots=True)
class _Job:
    prompt: tuple[int, ...]
    max_tokens: int
    output_len: int | None
    stop: tuple[str, ...]
    cancel_after: int | None  # cancel after this many events (0: right after submit)


def expected(job: _Job) -> tuple[str, str]:
    """(text, finish_reason) an uninterrupted run publishes for `job`."""
    key = prompt_key(job.prompt)
    n = job.max_tokens if job.output_len is None else min(job.max_tokens, job.output_len - 1)
    text = "".join(chr(token_at(key, i)) for i in range(n))
    cut = min((i for i in (text.find(s) for s in job.stop) if i >= 0), default=-1)
    if cut >= 0:
        return text[:cut], "stop"
    eos = job.output_len is not None and job.output_len <= job.max_tokens
    return text, "stop" if eos else "length"


def _jobs(config: SoakConfig) -> list[_Job]:
    rng = random.Random(config.seed)
    jobs = []
    for _ in range(config.requests):
        prompt = tuple(rng.randint(1, 255) for _ in range(rng.randint(1, config.max_prompt)))
        max_tokens = rng.randint(1, config.max_tokens)
        output_len = rng.randint(1, config.max_tokens) if rng.random() < config.eos_rate else None
        stop = tuple("".join(chr(ord("a") + rng.randrange(ALPHABET)) for _ in range(rng.randint(1, 2)))
                     for _ in range(rng.randint(1, 2))) if rng.random() < config.stop_rate else ()
        cancel = rng.randint(0, 4) if rng.random() < config.cancel_rate else None
        jobs.append(_Job(prompt, max_tokens, output_len, stop, cancel))
    return jobs


def rss_kb() -> int | None:
    """This process's resident set (VmRSS, kB) from /proc; None where there is no /proc."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    except (OSError, StopIteration):
        return None


def build(config: SoakConfig) -> tuple[Runtime, Scheduler, KeyedSimCore]:
    catalog = ordinary_catalog(max_batch=config.slots, prefill_chunks=(64, 256), max_prefill_tokens=256)
    max_context = config.max_prompt + config.max_tokens + 8
    sched = Scheduler(catalog, config=SchedulerConfig(request_slots=config.slots, max_context=max_context,
                                                      selection_slots=config.slots))
    faults = SimFaults(missing_timing=config.missing_timing, zero_timing=config.zero_timing,
                       rank_disagreement=config.rank_disagreement, raise_every=config.raise_every,
                       raise_rate=config.fault_rate)
    core = KeyedSimCore(catalog, _AffineCost(), seed=config.seed, faults=faults, request_slots=config.slots,
                        ranks=config.ranks)
    return Runtime(sched, core, tokenizer=LetterTokenizer()), sched, core


def run_soak(config: SoakConfig, progress=None) -> SoakReport:
    """Run the soak; `progress(report)` is called after each RSS sample."""
    jobs = _jobs(config)
    runtime, _, core = build(config)
    report = SoakReport(requests=len(jobs))
    lock = threading.Lock()
    deadline = time.monotonic() + config.deadline_s
    t0 = time.monotonic()
    report.rss_kb.append((0, rss_kb()))

    def one(index: int) -> None:
        job = jobs[index]
        stream = runtime.submit(job.prompt, max_tokens=job.max_tokens, stop=job.stop,
                                core_options={} if job.output_len is None else {"output_len": job.output_len})
        events = 0
        if job.cancel_after == 0:
            stream.cancel()
        while True:
            try:
                event = stream.next_event(max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                break
            if event is None:
                break
            events += 1
            if job.cancel_after is not None and events >= job.cancel_after:
                stream.cancel()
        _check(index, job, stream, report, lock)
        with lock:
            finished = sum(report.outcomes.values()) + report.lost
            if finished % config.rss_every == 0:
                report.rss_kb.append((finished, rss_kb()))
                if progress is not None:
                    progress(report)

    with runtime:
        with ThreadPoolExecutor(config.concurrency) as pool:
            for future in [pool.submit(one, i) for i in range(len(jobs))]:
                future.result()
        report.idle = runtime.wait_idle(max(1.0, deadline - time.monotonic()))
        snap = runtime.scheduler_stats
        report.frame_faults = runtime.stats.faults
        report.frames = sum(runtime.stats.executions_by_shape.values())
    report.measured_graphs = len(snap.estimates_ns)
    report.min_estimate_ns = min(snap.estimates_ns.values(), default=None)
    report.leaked_slots = snap.total_slots - snap.free_slots
    report.leaked_pages = snap.total_pages - snap.free_pages
    report.core_attached = core.attached  # the worker has run every detach once stopped
    report.wall_s = time.monotonic() - t0
    return report


def _check(index: int, job: _Job, stream, report: SoakReport, lock) -> None:
    want_text, want_finish = expected(job)
    reason = stream.finish_reason
    why = None
    if reason is None:
        why = "never ended"
    elif reason in ("stop", "length"):
        if (stream.text, reason) != (want_text, want_finish):
            why = f"published {stream.text!r} ({reason}), an uninterrupted run publishes {want_text!r} ({want_finish})"
    elif reason in ("cancelled", "error"):
        if reason == "error" and not stream.error:
            why = "failed without a reason"
        elif reason == "cancelled" and job.cancel_after is None:
            why = "cancelled without a cancel"
        elif not want_text.startswith(stream.text):
            why = f"published {stream.text!r}, not a prefix of {want_text!r}"
    else:
        why = f"unknown finish reason {reason!r}"
    with lock:
        if reason is None or why in ("never ended", "failed without a reason"):
            report.lost += 1
        else:
            report.outcomes[reason] = report.outcomes.get(reason, 0) + 1
        if why is not None:
            report.mismatched.append((index, why))

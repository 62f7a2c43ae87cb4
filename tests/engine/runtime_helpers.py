"""Shared fixtures for the runtime tests: paced and scripted cores, a decode-only tokenizer."""

from __future__ import annotations

import threading
import time

from helios.config import SchedulerConfig
from helios.engine.byte_tokenizer import ByteTokenizer
from helios.engine.core import Execution
from helios.engine.echo_core import AffineCost
from helios.runtime.runtime import Runtime
from helios.engine.sim_core import SimCore
from helios.graphs import GraphKind
from helios.prepare import ordinary_catalog
from helios.scheduler import CompletionRecord, ExecutionTiming, Scheduler

EOS = 256  # outside the byte range, so it never decodes to text


class DecodeOnlyTokenizer:
    """The byte tokenizer seen through `decode` alone, so Publication takes its incremental
    (sliding-window) decoding path rather than the exact token_bytes one."""

    def __init__(self):
        self.decode = ByteTokenizer().decode


class PacedSimCore(SimCore):
    """SimCore that sleeps for its simulated duration times `scale`, records fences, and can
    block on a hook (to cancel "in the middle" of a frame) or poison requests."""

    def __init__(self, catalog, *, scale: float = 0.2, **kw):
        super().__init__(catalog, AffineCost(), **kw)
        self.scale = scale
        self.fences: list[int] = []
        self.plans: dict[int, tuple] = {}  # fence -> handles
        self.poisoned: set[int] = set()
        self.hook = None
        self._lock = threading.Lock()

    def attach(self, handle, prompt=0, *, poison: bool = False, **options) -> None:
        if poison:
            self.poisoned.add(handle)
        super().attach(handle, prompt, **options)

    def execute(self, plan, fence):
        with self._lock:  # the runtime must never call the core from two threads at once
            self.fences.append(fence)
            self.plans[fence] = plan.handles
            if self.poisoned & set(plan.handles):
                self.faults.raise_on.add(fence)  # SimFaults raises CoreFault for this fence
            if self.hook is not None:
                self.hook(plan, fence)
            execution = self.run(plan, fence)
            time.sleep(execution.duration_ns * self.scale / 1e9)
            return execution

    def run(self, plan, fence) -> Execution:
        return SimCore.execute(self, plan, fence)


class ScriptedCore(PacedSimCore):
    """Emits each request's scripted token ids (one per output row), then EOS."""

    def __init__(self, catalog, **kw):
        super().__init__(catalog, **kw)
        self.scripts: dict[int, list[int]] = {}

    def attach(self, handle, prompt=0, *, script=(), **options) -> None:
        self.scripts[handle] = list(script)

    def run(self, plan, fence) -> Execution:
        duration = self.cost_model.duration_ns(plan.shape, [l.context_tokens for l in plan.lanes])
        records = []
        for lane in plan.lanes:
            script, tokens, eos = self.scripts.setdefault(lane.handle, []), [], False
            for _ in range(lane.output_rows):
                if not script:
                    tokens.append(EOS)
                    eos = True
                    break
                tokens.append(script.pop(0))
            records.append(CompletionRecord(lane.handle, lane.epoch, lane.prompt_tokens, tuple(tokens), eos))
        return Execution(tuple(records), ExecutionTiming((duration,), None, duration), duration)


class Gate:
    """A core hook that blocks the first frame matching `kind` (and handle) until released."""

    def __init__(self, kind: GraphKind, handle: int | None = None):
        self.kind, self.handle = kind, handle
        self.entered, self.release = threading.Event(), threading.Event()
        self.fence: int | None = None

    def __call__(self, plan, fence) -> None:
        if self.fence is None and plan.shape.kind is self.kind and (
                self.handle is None or self.handle in plan.handles):
            self.fence = fence
            self.entered.set()
            self.release.wait(20)


def make_runtime(core_cls=PacedSimCore, *, tokenizer=None, slots: int = 4, pages: int = 128,
                 max_context: int = 512, **core_kw):
    catalog = ordinary_catalog(max_batch=4, prefill_chunks=(64, 256), max_prefill_tokens=256)
    config = SchedulerConfig(request_slots=slots, kv_pages=pages, page_tokens=16,
                             max_context=max_context, selection_slots=slots)
    scheduler = Scheduler(catalog, config=config)
    core = core_cls(catalog, **core_kw)
    return Runtime(scheduler, core, tokenizer=tokenizer), scheduler, core


def resources(scheduler) -> tuple[int, int]:
    snap = scheduler.snapshot()
    return snap.free_slots, snap.free_pages

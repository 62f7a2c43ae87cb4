"""The runtime: drives any scheduler against any core on the real monotonic clock.

Threads:
- the runtime thread runs the step loop (helios.runtime.step): plan -> commit -> hand to the
  worker; completion -> scheduler.complete -> publication -> published_output -> plan again;
- the worker thread (helios.runtime.worker) owns the core: attach, execute (frames one after
  another, in fence order) and detach all run there, so a core never sees two threads.

The scheduler is not thread-safe. Every scheduler call happens under one lock (`_cv`'s),
whether it comes from the runtime thread, a submitting thread or a cancelling thread.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Sequence

from helios.errors import HeliosError, InvalidCompletion, InvalidRequest
from helios.runtime.checkpoint_admission import checkpoint_match
from helios.runtime.decisions import DEFAULT_DECISIONS, DecisionLog, service_class
from helios.runtime.host_times import HostTimes
from helios.runtime.publication import Publication
from helios.runtime.step import StepLoop, visible_tokens
from helios.runtime.worker import CoreWorker
from helios.runtime.stream import CANCELLED, ERROR, LENGTH, STOP, RequestStream, SamplingParams, StreamEvent
from helios.scheduler.plan import FinishReason, GeneratedToken, ScheduledPlan
from helios.scheduler.request_spec import RequestSpec
from helios.scheduler.protocol import SchedulerSnapshot

log = logging.getLogger(__name__)

_FINISH = {FinishReason.EOS: STOP, FinishReason.STOP: STOP, FinishReason.LENGTH: LENGTH,
           FinishReason.CONTEXT: LENGTH, FinishReason.CANCELLED: CANCELLED, FinishReason.ERROR: ERROR}
_SCHEDULER_REASON = {STOP: FinishReason.STOP, CANCELLED: FinishReason.CANCELLED, ERROR: FinishReason.ERROR}


class RuntimeClosed(HeliosError):
    """submit() on a runtime that is not started, is stopping, or has failed."""


@dataclass(slots=True)
class RuntimeStats:
    """Counters for the server's metrics; the scheduler's own are in `Runtime.snapshot()`."""

    submitted: int = 0
    prompt_tokens: int = 0  # of admitted requests, counted at admission
    generated_tokens: int = 0  # counted as each burst is published, not when its request ends
    finished: dict = field(default_factory=dict)  # finish_reason -> requests
    executions_by_shape: dict = field(default_factory=dict)  # shape label -> frames
    wall_ns_by_shape: dict = field(default_factory=dict)  # shape label -> dispatch-to-completion ns
    faults: int = 0
    loop_wakeups: int = 0
    decisions: HostTimes = field(default_factory=HostTimes)  # plan and commit of each dispatched frame
    completions: HostTimes = field(default_factory=HostTimes)  # complete and publish of each finished frame


class Runtime:
    """Runs `scheduler` against `core` in two threads; `submit()` and `cancel()` from any thread.

    `on_finish(stream)` runs on the runtime thread, under the scheduler lock, when a stream
    ends: keep it short (e.g. record stream.metrics and stream.usage).
    `decision_log`: how many decisions `decisions` (helios.runtime.decisions) keeps; 0: none.
    """

    def __init__(self, scheduler, core, *, tokenizer=None, clock: Callable[[], int] = time.monotonic_ns,
                 on_finish: Callable[[RequestStream], None] | None = None, idle_poll_s: float = 0.05,
                 decision_log: int = DEFAULT_DECISIONS):
        self.scheduler = scheduler
        self.core = core
        self.tokenizer = tokenizer
        self.on_finish = on_finish
        self.stats = RuntimeStats()
        self.error: BaseException | None = None  # set when the loop itself failed
        self._clock = clock
        self._idle_poll_s = idle_poll_s
        self._cv = threading.Condition(threading.RLock())
        self._streams: dict[int, RequestStream] = {}
        self._pubs: dict[int, Publication] = {}
        self._inbox: deque = deque()  # worker -> runtime thread: completions, faults, attach failures
        self._worker = CoreWorker(core, self._post, clock)  # owns the core (helios.runtime.worker)
        self._dispatched: dict[int, tuple[ScheduledPlan, int]] = {}  # fence -> (plan, dispatch ns)
        self._frame_logprobs: dict = {}  # the finishing frame's Execution.logprobs
        # The scheduler's last decisions, recorded by reference and formatted when read (/debug/decisions).
        self.decisions = DecisionLog(decision_log, clock(), time.time_ns()) if decision_log else None
        # Detaches are queued behind the core's earlier work, so the worker stays the only caller.
        self._step = StepLoop(scheduler, clock, self._worker.detach,
                              on_decision=lambda ns: self.stats.decisions.observe(ns), decisions=self.decisions)
        self._accepting = False
        self._running = False
        self._threads: list[threading.Thread] = []

    @property
    def scheduler_stats(self) -> SchedulerSnapshot:
        return self.snapshot()[0]

    def snapshot(self) -> tuple[SchedulerSnapshot, RuntimeStats]:
        """The scheduler's snapshot and a copy of the runtime's counters, taken under the lock
        that serializes scheduler calls, so both describe one consistent state."""
        with self._cv:
            stats = dataclasses.replace(self.stats, finished=dict(self.stats.finished),
                                        executions_by_shape=dict(self.stats.executions_by_shape),
                                        wall_ns_by_shape=dict(self.stats.wall_ns_by_shape),
                                        decisions=self.stats.decisions.copy(),
                                        completions=self.stats.completions.copy())
            return self.scheduler.snapshot(), stats

    # ---- lifecycle ---------------------------------------------------------------------------
    def start(self) -> Runtime:
        with self._cv:
            if self._threads:
                raise RuntimeError("a Runtime can be started once")
            self._accepting = self._running = True
            self._threads = [threading.Thread(target=self._loop, name="helios-runtime", daemon=True),
                             threading.Thread(target=self._worker.run, name="helios-worker", daemon=True)]
        for t in self._threads:
            t.start()
        return self

    def stop(self, timeout: float = 10.0, *, drain_s: float = 0.0) -> bool:
        """Stop admitting; let requests finish for up to `drain_s`, cancel the rest, wait for
        frames already on the core, and join the threads, all within `timeout` seconds.
        Returns True when both threads ended in time."""
        deadline = time.monotonic() + timeout
        with self._cv:
            self._accepting = False
            self._cv.wait_for(lambda: not self._streams, max(0.0, min(drain_s, timeout)))
            for stream in list(self._streams.values()):
                self._finish(stream, CANCELLED)
            self._running = False
            self._cv.notify_all()
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self._threads)

    def __enter__(self) -> Runtime:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until no request is live and no frame is on the core; False on timeout."""
        with self._cv:
            return self._cv.wait_for(lambda: not self._streams and not self._dispatched and not self._inbox, timeout)

    # ---- requests ----------------------------------------------------------------------------
    def submit(self, prompt_ids: Sequence[int], params: SamplingParams | None = None, **overrides) -> RequestStream:
        """Admit a request and return its stream. Raises InvalidRequest for a request the
        scheduler cannot serve, RuntimeClosed when not accepting."""
        params = SamplingParams(**overrides) if params is None else dataclasses.replace(params, **overrides)
        prompt = [int(t) for t in prompt_ids]
        if not prompt or any(t < 0 for t in prompt):
            raise InvalidRequest("prompt_ids must be a nonempty list of nonnegative token ids")
        if params.stop and self.tokenizer is None:
            raise InvalidRequest("stop strings need a tokenizer")
        # Stop strings are host-side feedback: the spec keeps such requests out of queued frames.
        # A restored prefix is never computed, so it has no scores: a scored prompt always runs whole.
        scored = params.prompt_logprobs is not None
        match, store = checkpoint_match(self.scheduler, self.core, prompt) if not scored else (None, None)
        spec = RequestSpec(len(prompt), params.max_tokens, client=params.client,
                           host_feedback=bool(params.stop), request_id=params.request_id,
                           cached_tokens=match.tokens if match else 0, endpoints=params.endpoints,
                           score_prompt=scored, service_class=params.service_class,
                           tenant_weight=params.tenant_weight, priority=params.priority)
        options = {**params.attach_options(), **({"checkpoint": match} if match else {})}
        with self._cv:
            try:
                if not self._accepting:
                    raise RuntimeClosed("the runtime is not accepting requests")
                now = self._step.now()
                handle = self.scheduler.admit(spec, now)
            except BaseException:
                if match is not None:  # not admitted: the core never owns the guard
                    store.release(match.entry)
                raise
            stream = RequestStream(handle, len(prompt), params, now, self._cancel)
            self._streams[handle] = stream
            self._pubs[handle] = Publication(self.tokenizer, params.stop, logprobs=params.logprobs is not None,
                                             include_stop=params.include_stop_str_in_output,
                                             skip_special=params.skip_special_tokens)
            # Queued before any execute that can include the handle: the worker is FIFO.
            if self.decisions is not None:
                self.decisions.name(handle, params.request_id, service_class(spec))
            self._worker.attach(handle, prompt, options)
            self._step.attached(handle)
            self.stats.submitted += 1
            self.stats.prompt_tokens += len(prompt)
            self._cv.notify_all()
        return stream

    def _cancel(self, stream: RequestStream) -> None:
        with self._cv:
            self._finish(stream, CANCELLED)

    # ---- the runtime thread ------------------------------------------------------------------
    def _loop(self) -> None:
        with self._cv:
            try:
                while True:
                    while self._inbox:
                        self._handle(self._inbox.popleft())
                    if not self._running and not self._dispatched:
                        break
                    self._step.dispatch(self._submit)
                    if self._inbox:
                        continue
                    # Live requests with nothing planned or on the core only arise from
                    # time-dependent scheduler state, so poll slowly; otherwise sleep until woken.
                    stalled = bool(self._streams) and not self._dispatched
                    self._cv.notify_all()  # state changed: wake wait_idle() and stop()
                    self._cv.wait(self._idle_poll_s if stalled else None)
                    self.stats.loop_wakeups += 1
            except BaseException as exc:  # a scheduler bug: fail everyone rather than hang them
                log.exception("helios runtime loop failed")
                self.error = exc
                self._accepting = self._running = False
                for stream in list(self._streams.values()):
                    self._end_stream(stream, ERROR, f"runtime failure: {exc}")
            finally:
                self._worker.close()
                self._cv.notify_all()

    def _submit(self, plan: ScheduledPlan, fence: int) -> None:
        self._dispatched[fence] = (plan, self._step.last_ns)
        self._worker.execute(plan, fence)

    def _handle(self, item) -> None:
        kind = item[0]
        if kind == "done":
            _, fence, execution, end_ns = item
            plan, dispatch_ns = self._dispatched.pop(fence)
            timing = dataclasses.replace(execution.timing, wall_ns=max(0, end_ns - dispatch_ns))
            self._step.now()
            start = time.perf_counter_ns()
            self._frame_logprobs = execution.logprobs or {}
            for handle, reason in (execution.row_errors or {}).items():  # only these rows fail
                if (stream := self._streams.get(handle)) is not None:
                    log.warning("request %s failed alone in fence %d: %s", handle, fence, reason)
                    self._finish(stream, ERROR, f"the output constraint failed: {reason}")
            for handle, entries in (execution.prompt_logprobs or {}).items():
                if (stream := self._streams.get(handle)) is not None and stream.prompt_logprobs is not None:
                    stream.prompt_logprobs.extend(entries)  # before any of its events: the prompt ran first
            try:
                self._step.finish(fence, dataclasses.replace(execution, timing=timing), self._publish)
            except InvalidCompletion as exc:  # state unchanged: resolve the frame as a fault
                self._fail_frame(fence, plan, f"engine returned an invalid completion: {exc}")
                return
            finally:
                self._frame_logprobs = {}
            self.stats.completions.observe(time.perf_counter_ns() - start)
            label = plan.shape.label()
            self.stats.executions_by_shape[label] = self.stats.executions_by_shape.get(label, 0) + 1
            self.stats.wall_ns_by_shape[label] = self.stats.wall_ns_by_shape.get(label, 0) + timing.wall_ns
        elif kind == "fault":
            _, fence, exc = item
            plan, _ = self._dispatched.pop(fence)
            self._fail_frame(fence, plan, f"engine fault: {exc}")
        elif kind == "attach_failed":
            _, handle, exc = item
            if (stream := self._streams.get(handle)) is not None:
                self._finish(stream, ERROR, f"engine could not attach the request: {exc}")

    def _fail_frame(self, fence: int, plan: ScheduledPlan, message: str) -> None:
        """Fail only the frame's requests; resolve the fence so slots and pages come back."""
        self.stats.faults += 1
        log.warning("fence %d failed: %s", fence, message)
        for handle in plan.handles:
            if (stream := self._streams.get(handle)) is not None:
                self._finish(stream, ERROR, message)
        self._step.fail(fence, plan)

    def _publish(self, g: GeneratedToken) -> bool:
        """Show one burst on its stream; True when it made output visible."""
        stream, pub = self._streams.get(g.handle), self._pubs.get(g.handle)
        if stream is None or pub is None:
            return False  # already ended on the host side (cancelled, stopped, failed)
        stream._count(len(g.tokens))
        self.stats.generated_tokens += len(g.tokens)
        # A burst's entries are aligned with its record's tokens; a stripped EOS is the last one.
        piece = pub.feed(visible_tokens(g), self._frame_logprobs.get(g.handle))
        if g.finish is not None and not piece.stopped:
            piece = piece.then(pub.flush())
        finish = STOP if piece.stopped else (_FINISH[g.finish] if g.finish is not None else None)
        visible = bool(piece.text or (piece.token_ids and not pub.has_text))
        if visible:
            # Output age is measured from the actual host publication time.
            stream.metrics.published(self._step.now())
            if finish is None:
                stream._push(StreamEvent(piece.text, piece.token_ids, None, piece.logprobs))
        if finish is not None:
            self._finish(stream, finish, event=StreamEvent(piece.text, piece.token_ids, finish, piece.logprobs))
        return visible

    def _finish(self, stream: RequestStream, reason: str, error: str | None = None,
                event: StreamEvent | None = None) -> None:
        """End a stream (under the lock). Host-side endings cancel the request in the scheduler;
        its slot and pages come back through the fence rules."""
        if stream.done or self._streams.get(stream.handle) is not stream:
            return
        sched_reason = _SCHEDULER_REASON.get(reason)
        if sched_reason is not None:
            self._step.cancel(stream.handle, sched_reason)
        self._end_stream(stream, reason, error, event)

    def _end_stream(self, stream: RequestStream, reason: str, error: str | None,
                    event: StreamEvent | None = None) -> None:
        self._streams.pop(stream.handle, None)
        self._pubs.pop(stream.handle, None)
        stream.metrics.finished_ns = self._step.last_ns
        stream._push(event or StreamEvent("", (), reason), error)
        self.stats.finished[reason] = self.stats.finished.get(reason, 0) + 1
        self._cv.notify_all()
        if self.on_finish is not None:
            try:
                self.on_finish(stream)
            except Exception:
                log.exception("on_finish hook failed")

    # ---- from the worker thread ---------------------------------------------------------------
    def _post(self, item) -> None:
        with self._cv:
            self._inbox.append(item)
            self._cv.notify_all()

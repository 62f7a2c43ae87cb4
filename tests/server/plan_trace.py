"""A plan trace for scenario tests: a core wrapper that records every frame the runtime hands
the engine (fence order is execution order), and the scheduling properties checked on it.
Counting graphs, not seconds, makes the properties independent of machine speed."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from helios.graphs import GraphKind


@dataclass(frozen=True, slots=True)
class Step:
    """One executed frame: its fence, graph kind and label, and per lane (handle, prompt
    tokens consumed, output rows)."""

    fence: int
    kind: GraphKind
    label: str
    lanes: tuple[tuple[int, int, int], ...]

    def has(self, handle: int) -> bool:
        return any(h == handle for h, _, _ in self.lanes)

    def prefills(self, handle: int) -> bool:
        return any(h == handle and p > 0 for h, p, _ in self.lanes)

    def outputs(self, handle: int) -> bool:
        return any(h == handle and rows > 0 for h, _, rows in self.lanes)


class TracingCore:
    """Wraps a core: records each attached prompt's length and each executed frame, and
    delegates everything else. `wait_for(pred, timeout)` blocks on new frames, with a deadline."""

    def __init__(self, core):
        self._core = core
        self.steps: list[Step] = []
        self.prompts: dict[int, int] = {}  # handle -> prompt tokens, in attach order
        self._cv = threading.Condition()
        self._hold = None  # a Step predicate: hold the first matching frame until released
        self.held = threading.Event()
        self.release = threading.Event()

    def hold(self, predicate) -> None:
        """Hold the first frame matching `predicate` in the engine until `release` is set, so a
        test can make requests arrive while that frame runs, whatever the machine's speed."""
        self.held.clear()
        self.release.clear()
        self._hold = predicate

    def __getattr__(self, name):
        return getattr(self._core, name)

    def attach(self, handle, prompt=0, **options):
        with self._cv:
            self.prompts[handle] = prompt if isinstance(prompt, int) else len(prompt)
            self._cv.notify_all()
        return self._core.attach(handle, prompt, **options)

    def detach(self, handle):
        return self._core.detach(handle)

    def execute(self, plan, fence):
        # Recorded on entry: the worker runs frames one at a time in fence order, so the trace
        # is the execution order, and a waiter sees a frame as soon as the engine has it.
        step = Step(fence, plan.shape.kind, plan.shape.label(),
                    tuple((l.handle, l.prompt_tokens, l.output_rows) for l in plan.lanes))
        with self._cv:
            self.steps.append(step)
            self._cv.notify_all()
            hold = self._hold is not None and self._hold(step)
            if hold:
                self._hold = None
        if hold:
            self.held.set()
            if not self.release.wait(300):
                raise RuntimeError("a held frame was never released")
        return self._core.execute(plan, fence)

    def wait_for(self, predicate, timeout: float, what: str):
        with self._cv:
            if not self._cv.wait_for(lambda: predicate(self), timeout):
                raise AssertionError(f"timed out after {timeout} s waiting for {what}; trace: {self.summary()}")

    def snapshot(self) -> list[Step]:
        with self._cv:
            return list(self.steps)

    def handle_with_prompt(self, predicate) -> list[int]:
        with self._cv:
            return [h for h, n in self.prompts.items() if predicate(n)]

    def summary(self, last: int = 40) -> str:
        return " ".join(f"{s.fence}:{s.label}{[h for h, _, _ in s.lanes]}" for s in self.steps[-last:])


def prefill_window(steps: list[Step], handle: int) -> tuple[int, int]:
    """Indices of the first and last frames that consumed `handle`'s prompt."""
    idx = [i for i, s in enumerate(steps) if s.prefills(handle)]
    assert idx, f"request {handle} was never prefilled"
    return idx[0], idx[-1]


def longest_decode_stall(steps: list[Step], long: int, decoder: int) -> int:
    """The most prefill frames of `long` that run in a row without `decoder` being served in
    between, counted while `decoder` is decoding (after its first output, before its last
    frame). Frames of other requests do not count: they are the other decoders' turns."""
    served = [i for i, s in enumerate(steps) if s.outputs(decoder)]
    if not served:
        return 0
    run = worst = 0
    for step in steps[served[0] + 1:served[-1] + 1]:
        if step.has(decoder):
            run = 0
        elif step.prefills(long):
            run += 1
            worst = max(worst, run)
    return worst


def first_output_index(steps: list[Step], handle: int) -> int | None:
    """Index of the frame that produced `handle`'s first output token."""
    return next((i for i, s in enumerate(steps) if s.outputs(handle)), None)

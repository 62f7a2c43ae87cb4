"""Startup lines as they happen: sizing, loading the model, the warm-up's progress, the ready line.

`flare run` takes 30-60 s to start on a CPU (loading and converting the weights, then timing every
prepared graph); each stage prints when it begins, so a user sees where the time goes. On a
terminal the warm-up is a tqdm bar; otherwise (a log file, a service manager) it is plain lines,
at most one every `PLAIN_EVERY_S` seconds plus one when each pass completes.
"""

from __future__ import annotations

import sys
import textwrap
import time
from typing import TextIO

PLAIN_EVERY_S = 2.0
WIDTH = 100  # the warm-up's cost table wraps at this many characters per line


class StartupLog:
    """Prints `flare: ...` lines to `stream` (stderr by default), each with the seconds since start."""

    def __init__(self, stream: TextIO | None = None, tty: bool | None = None):
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.start = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def line(self, text: str) -> None:
        print(f"flare: {text}", file=self.stream, flush=True)

    def step(self, text: str) -> None:
        """A stage that begins now (its line carries the time since startup began)."""
        self.line(f"[{self.elapsed():5.1f} s] {text}")

    def warmup(self) -> WarmupProgress:
        return WarmupProgress(self)


class WarmupProgress:
    """The warm-up's `progress(stage, k, n)` callback: "k/N graphs" of each pass, with elapsed time."""

    def __init__(self, log: StartupLog):
        self.log = log
        self.start = time.perf_counter()
        self.bar = None
        self.stage: str | None = None
        self.last_print = self.start

    def __call__(self, stage: str, done: int, total: int) -> None:
        if self.log.tty:
            self._bar(stage, done, total)
            return
        now = time.perf_counter()
        if done == total or now - self.last_print >= PLAIN_EVERY_S:
            self.last_print = now
            self.log.line(f"warm-up {stage}: {done}/{total} graphs, {now - self.start:.1f} s")

    def _bar(self, stage: str, done: int, total: int) -> None:
        from tqdm import tqdm

        if self.bar is None:
            self.bar = tqdm(total=total, unit="graph", file=self.log.stream, leave=False,
                            bar_format="flare: warm-up {desc}: {n_fmt}/{total_fmt} graphs {bar} {elapsed}")
        if stage != self.stage:
            self.stage = stage
            self.bar.reset(total=total)
            self.bar.set_description_str(stage, refresh=False)
        self.bar.n = done
        self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def wrap(head: str, items: list[str]) -> list[str]:
    """`  head: a, b, c, ...` wrapped to WIDTH characters, continuation lines indented further."""
    return textwrap.wrap(f"{head}: " + ", ".join(items), WIDTH, initial_indent="  ", subsequent_indent="      ",
                         break_long_words=False, break_on_hyphens=False)

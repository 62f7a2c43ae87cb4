"""Running the report's tasks where a user can watch and stop them: the plan first, one line per
finished task with elapsed time and ETA (a terminal or not), and Ctrl-C that stops at once.

Ctrl-C (SIGINT) cancels the tasks not yet started and terminates the worker processes (they ignore
SIGINT themselves, so no worker prints a traceback); `run_tasks` then raises `Interrupted` with the
tasks that finished, which the report writes out. `ProcessPoolExecutor.__exit__` alone would wait for
every queued task, hours on a full report.
"""

from __future__ import annotations

import signal
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass
from typing import Callable

# CPU time per simulated token (prompt and output) of a run: about 11 us measured on the 2-vCPU Xeon
# under load (`--quick`: 2.0 M tokens in 22 s of CPU); a prompt-heavy trace (Mooncake) costs less per
# token, a decode-heavy one and Helios' richer planning cost more, so the estimate is a range.
US_PER_TOKEN = (10.0, 40.0)


class Interrupted(Exception):
    """Ctrl-C: `finished` maps each completed task's key to its result."""

    def __init__(self, finished: dict, total: int):
        super().__init__(f"interrupted after {len(finished)} of {total} tasks")
        self.finished = finished
        self.total = total


@dataclass(frozen=True)
class Plan:
    tasks: int
    runs: int  # simulated runs, at most (the goodput bisection may stop early)
    requests: int  # simulated requests over all runs, at most
    tokens: int  # their prompt and output tokens
    jobs: int

    def cpu_s(self) -> tuple[float, float]:
        return tuple(self.tokens * us / 1e6 for us in US_PER_TOKEN)

    def describe(self, quick: bool) -> str:
        low, high = self.cpu_s()
        text = (f"plan: {self.tasks} tasks (trace x scheduler x seed), up to {self.runs} simulated runs of "
                f"{self.requests // max(self.runs, 1)} requests on average; estimated {_duration(low)}-"
                f"{_duration(high)} of CPU, {_duration(low / self.jobs)}-{_duration(high / self.jobs)} with "
                f"{self.jobs} job{'s' * (self.jobs != 1)}")
        if not quick:
            text += "; --quick runs a smoke configuration (10-s windows, one seed, one load) in about a minute"
        return text


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


class Progress:
    """One line per finished task on `stream`: k/N, the task, its time, the elapsed time and an ETA."""

    def __init__(self, total: int, stream=None):
        self.total, self.done = total, 0
        self.stream = stream if stream is not None else sys.stderr
        self.start = time.perf_counter()

    def finished(self, key, result: dict) -> None:
        self.done += 1
        elapsed = time.perf_counter() - self.start
        eta = elapsed / self.done * (self.total - self.done)
        print(f"flare sim report: [{self.done}/{self.total}] {'/'.join(map(str, key))}: {result.get('runs', 0)} runs "
              f"in {_duration(result.get('wall_s', 0.0))}; elapsed {_duration(elapsed)}, ETA {_duration(eta)}",
              file=self.stream, flush=True)


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops the workers (terminate)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not the parent's handler: terminate() ends a worker


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def run_tasks(tasks: list[tuple], run: Callable[..., dict], jobs: int, progress: Progress) -> dict:
    """`run(*task)` for each task, in `jobs` worker processes (in this process when jobs is 1):
    {task: result}. Ctrl-C (or SIGTERM) raises Interrupted with the finished tasks' results."""
    previous = signal.signal(signal.SIGTERM, _interrupt)  # `kill` stops the workers as Ctrl-C does
    try:
        return _run_tasks(tasks, run, jobs, progress)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run_tasks(tasks: list[tuple], run: Callable[..., dict], jobs: int, progress: Progress) -> dict:
    results: dict = {}
    if jobs <= 1 or len(tasks) <= 1:
        try:
            for task in tasks:
                results[task] = run(*task)
                progress.finished(task, results[task])
        except KeyboardInterrupt:
            raise Interrupted(results, len(tasks)) from None
        return results
    pool = ProcessPoolExecutor(max_workers=jobs, initializer=_ignore_sigint)
    try:
        futures = {pool.submit(run, *task): task for task in tasks}
        pending = set(futures)
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for fut in done:
                results[futures[fut]] = fut.result()
                progress.finished(futures[fut], results[futures[fut]])
    except KeyboardInterrupt:
        # No public way to stop a running task: terminate the workers (the executor's own list).
        for process in list(getattr(pool, "_processes", {}).values()):
            process.terminate()
        pool.shutdown(wait=False, cancel_futures=True)
        raise Interrupted(results, len(tasks)) from None
    pool.shutdown()
    return results

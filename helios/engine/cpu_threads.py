"""Where TorchCore's CPU work runs: one dedicated thread, with as many torch threads as the CPUs
other processes leave free.

Why one thread. libgomp gives every thread that starts a parallel region its own pool of workers,
and once a process holds more OpenMP threads than it has CPUs it shortens every wait at a barrier
to a throttled spin (1,000 rounds) before sleeping. A server that loaded the model and warmed up on
its main thread and then decoded on a worker thread held two pools, and every decode paid for it:
measured on a 2-vCPU VM, a B=16 decode took 168 ms on the worker against 85 ms on the main thread
(and 128 ms with one torch thread). So every model call goes through `TorchThread.call`, which
runs it on the same thread whoever calls: the process keeps one pool.

Why a governed thread count. Spinning at a barrier is what makes small kernels fast (the passive
policy, which sleeps instead, made the same decode 170-180 ms), but when another process holds a
core, a spinning thread waits for a peer that is not running: with one CPU burner on the 2-vCPU
VM a B=1 decode took 117 ms with two spinning threads and 62 ms with one. So before each call, at
most every `interval_s`, the thread reads how much CPU other processes used since the last look
(/proc/stat on the CPUs this process may run on, less this process's own time) and keeps one
torch thread per CPU they left free. Without /proc/stat (not Linux) the count stays fixed.
"""

from __future__ import annotations

import math
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterable, TypeVar

import torch

T = TypeVar("T")

# A core counts as free when other processes used less than this share of it: a background
# process's occasional tick does not cost a thread, a steady one does.
FREE_CORE_SLACK = 0.25


def threads_for(cores: int, others: float, most: int) -> int:
    """Torch threads to run when other processes used `others` CPUs of our `cores` (1..most)."""
    return max(1, min(most, math.floor(cores - others + FREE_CORE_SLACK)))


def _busy_ticks(line: str) -> int:
    # user nice system idle iowait irq softirq steal ...: busy excludes idle and iowait; steal
    # (another VM on the host) is time these CPUs were not ours either.
    v = [int(x) for x in line.split()[1:9]]
    return v[0] + v[1] + v[2] + v[5] + v[6] + v[7]


def _own_cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


class CpuLoad:
    """CPU time other processes took on the CPUs this process may use, from /proc/stat."""

    def __init__(self, stat_path: str = "/proc/stat", cpus: Iterable[int] | None = None,
                 clock: Callable[[], float] = time.monotonic, own: Callable[[], float] = _own_cpu_seconds):
        self.path = stat_path
        if cpus is None and hasattr(os, "sched_getaffinity"):
            cpus = os.sched_getaffinity(0)
        self.cpus = sorted(cpus) if cpus is not None else None
        self.ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self._clock, self._own = clock, own
        self._last = self._sample()

    @property
    def available(self) -> bool:
        return self._last is not None

    @property
    def cores(self) -> int:
        return len(self.cpus or ()) or (os.cpu_count() or 1)

    def _sample(self) -> tuple[float, float, float] | None:
        wanted = {f"cpu{i}" for i in self.cpus} if self.cpus else None
        try:
            with open(self.path) as f:
                lines = [line for line in f if line.startswith("cpu") and not line.startswith("cpu ")]
            busy = sum(_busy_ticks(line) for line in lines if wanted is None or line.split()[0] in wanted)
        except (OSError, ValueError, IndexError):  # unreadable or not the format we know: no governing
            return None
        return self._clock(), busy / self.ticks, self._own()

    def others(self) -> float | None:
        """CPUs' worth of time other processes used since the previous call (None: unknown)."""
        now = self._sample()
        if now is None or self._last is None:
            return None
        (t0, busy0, own0), (t1, busy1, own1) = self._last, now
        self._last = now
        if t1 <= t0:
            return None
        return max(0.0, ((busy1 - busy0) - (own1 - own0)) / (t1 - t0))


class TorchThread:
    """Runs TorchCore's calls on one dedicated thread; `threads=None` governs the torch thread
    count from the CPUs other processes leave free (at most torch's default), an int fixes it."""

    def __init__(self, threads: int | None = None, interval_s: float = 0.5, load: CpuLoad | None = None):
        if threads is not None and threads < 1:
            raise ValueError(f"threads must be positive, got {threads}")
        self.most = threads or torch.get_num_threads()
        self.threads = self.most
        self.interval_s = interval_s
        self.load = None if threads is not None else (load or CpuLoad())
        self._next = 0.0
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="helios-torch",
                                        initializer=torch.set_num_threads, initargs=(self.most,))
        self._ident: int | None = None

    def call(self, fn: Callable[..., T], *args, **kwargs) -> T:
        """fn(*args, **kwargs) on the torch thread (directly when already on it)."""
        if threading.get_ident() == self._ident:
            return fn(*args, **kwargs)
        return self._pool.submit(self._run, fn, args, kwargs).result()

    def _run(self, fn, args, kwargs):
        self._ident = threading.get_ident()
        self._govern()
        return fn(*args, **kwargs)

    def _govern(self) -> None:
        if self.load is None or not self.load.available or time.monotonic() < self._next:
            return
        self._next = time.monotonic() + self.interval_s
        others = self.load.others()
        if others is None:
            return
        n = threads_for(self.load.cores, others, self.most)
        if n != self.threads:
            torch.set_num_threads(n)
            self.threads = n

"""Baseline schedulers implementing the Helios scheduler protocol (DESIGN.md sections 3 and 7).

Each is a drop-in replacement for `helios.scheduler.Scheduler`: same constructor shape
`(catalog, policy=None, config=None, **options)`, same protocol methods and attributes.

    helios     the Helios scheduler itself
    vllm-fcfs  vLLM V1-style FCFS continuous batching with chunked prefill (vllm_fcfs.py)
    sarathi    Sarathi-Serve stall-free hybrid batches under a token budget (sarathi.py)
    vtc        VTC per-client virtual token counters (vtc.py), weighted by tenant
    vllm-priority  vLLM V1's priority policy: strict priority, FCFS inside a priority (vllm_priority.py)
    edf        earliest first-token deadline first under Sarathi-Serve's token budget (edf.py)
    direct     the spec's "direct" path: Helios decode selection, 7/8 moving-average costs,
               FCFS prefill (direct.py)
"""

from __future__ import annotations

from typing import Callable

from helios.baselines.direct import DirectScheduler, MovingAverageCost
from helios.baselines.edf import EdfScheduler
from helios.baselines.sarathi import SarathiScheduler
from helios.baselines.vllm_fcfs import VllmFcfsScheduler
from helios.baselines.vllm_priority import VllmPriorityScheduler
from helios.baselines.vtc import VTCScheduler
from helios.config import PolicyConfig, SchedulerConfig
from helios.errors import ConfigError
from helios.graphs import Catalog
from helios.scheduler.core import Scheduler

SCHEDULERS: dict[str, Callable[..., Scheduler]] = {
    "helios": Scheduler,
    "vllm-fcfs": VllmFcfsScheduler,
    "sarathi": SarathiScheduler,
    "vtc": VTCScheduler,
    "direct": DirectScheduler,
    "vllm-priority": VllmPriorityScheduler,
    "edf": EdfScheduler,
}


def make_scheduler(name: str, catalog: Catalog, policy: PolicyConfig | None = None,
                   config: SchedulerConfig | None = None, **options) -> Scheduler:
    """Build a scheduler by name; `options` go to the baseline (e.g. token_budget=512).

    An unknown name raises ConfigError (a ValueError) that lists the valid names.
    """
    factory = SCHEDULERS.get(name)
    if factory is None:
        raise ConfigError("scheduler", f"unknown scheduler {name!r}; valid names: {', '.join(SCHEDULERS)}")
    return factory(catalog, policy, config, **options)


__all__ = ["SCHEDULERS", "make_scheduler", "DirectScheduler", "MovingAverageCost", "SarathiScheduler",
           "VllmFcfsScheduler", "VTCScheduler", "VllmPriorityScheduler", "EdfScheduler"]

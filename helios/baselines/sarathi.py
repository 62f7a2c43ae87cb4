"""Sarathi-Serve: chunked prefills with stall-free batching under a token budget.

Paper: A. Agrawal et al., "Taming Throughput-Latency Tradeoff in LLM Inference with
Sarathi-Serve", OSDI 2024. Code: github.com/microsoft/sarathi-serve,
`sarathi/core/scheduler/sarathi_scheduler.py` (`SarathiScheduler._schedule`), whose rules
this class reproduces on our catalog:

- Every iteration's batch is fixed when it starts: *all* ongoing decodes (one token each,
  counted against the budget), then the leftover of the token budget `chunk_size` (here
  `token_budget`, default 512, the Sarathi-Serve default) filled with prefill chunks: requests
  whose prefill is incomplete first, then waiting requests in FCFS order, each chunk
  min(prompt left, budget left). Decodes are never paused for a prefill ("stall-free"): when the
  decodes alone use the budget, the iteration carries no prefill at all. Each iteration's budget
  starts from zero: nothing of a previous iteration is carried over, also after the device idled.
- A waiting request that cannot be allocated, or that would exceed `max_num_seqs`, stops the
  admission scan.
- The iteration runs as one hybrid forward over its real tokens (decodes and chunks packed, no
  padding); a decode-only iteration replays a captured decode graph (`iteration.IterationScheduler`,
  `packed=True`, as the simulator runs it). On an engine with prepared graphs only (`packed=False`)
  the same batch runs as its decode graph, then one prefill graph of the chunks chosen with it.

One frame is in flight at a time, like the reference engine. As in the vLLM baseline, pages are
reserved for the whole extent at admission, so there is no preemption.
"""

from __future__ import annotations

from helios.baselines.iteration import IterationScheduler
from helios.config import PolicyConfig, SchedulerConfig
from helios.graphs import Catalog


class SarathiScheduler(IterationScheduler):
    name = "sarathi"
    default_token_budget = 512

    def __init__(self, catalog: Catalog, policy: PolicyConfig | None = None,
                 config: SchedulerConfig | None = None, *, chunk_size: int | None = None,
                 token_budget: int | None = None, packed: bool = False):
        super().__init__(catalog, policy, config,
                         token_budget=chunk_size if chunk_size is not None else token_budget, packed=packed)

    @property
    def chunk_size(self) -> int:
        return self.token_budget

"""vLLM V1-style FCFS continuous batching with chunked prefill.

Paper: W. Kwon et al., "Efficient Memory Management for Large Language Model Serving with
PagedAttention", SOSP 2023. Code: github.com/vllm-project/vllm, `vllm/v1/core/sched/scheduler.py`
(`Scheduler.schedule`), whose rules this class reproduces on our catalog:

- One step has a token budget, `max_num_batched_tokens` (here `token_budget`, default 2048:
  V1's OpenAI-server default on A100-class GPUs, 8192 on H100-class ones; see
  `EngineArgs.get_batch_defaults` in `vllm/engine/arg_utils.py`). The RUNNING requests are
  scheduled first, each for the tokens it still needs, while budget remains; then WAITING
  requests in FCFS order, each getting min(prompt left, budget left) tokens (chunked
  prefill), until the budget or `max_num_seqs` runs out. A waiting request that cannot be allocated stops the scan: the
  queue head blocks everything behind it, so service starts in arrival order.
- `max_num_seqs` may not exceed `max_num_batched_tokens` (V1 checks this at start-up); here it
  is the largest captured decode bucket, capped by the request slots and the budget.
- The step's batch is fixed when it starts (one `SchedulerOutput` per step): decodes and
  prefill chunks are chosen together, and the whole batch runs as one varlen forward over its
  real packed tokens. Only a decode-only batch is padded, to a captured CUDA-graph size (here the
  smallest captured decode graph). How many prompts a step takes is limited by the budget and
  `max_num_seqs` alone, never by prepared prefill shapes (`iteration.IterationScheduler`,
  `packed=True`, as the simulator runs it).

Decode-first matches V0's chunked-prefill policy and the design brief; V1 walks its running list
in admission order, which differs only when an earlier request is still prefilling. vLLM executes
one step at a time (async scheduling off, the default), so one frame is in flight.

Differences from vLLM, forced by the protocol: KV pages are reserved for the request's whole
extent at its first chunk (so there is no recompute preemption). On an engine with prepared
graphs only (`packed=False`, the torch core) a step runs as its decode graph followed by one
prefill graph of the chunks chosen with it, each cut to the catalog's prefill capacities.
"""

from __future__ import annotations

from helios.baselines.iteration import IterationScheduler
from helios.config import PolicyConfig, SchedulerConfig
from helios.graphs import Catalog


class VllmFcfsScheduler(IterationScheduler):
    name = "vllm-fcfs"
    default_token_budget = 2048

    def __init__(self, catalog: Catalog, policy: PolicyConfig | None = None,
                 config: SchedulerConfig | None = None, *, max_num_batched_tokens: int | None = None,
                 token_budget: int | None = None, packed: bool = False):
        budget = max_num_batched_tokens if max_num_batched_tokens is not None else token_budget
        super().__init__(catalog, policy, config, token_budget=budget, packed=packed)
        # V1 requires max_num_batched_tokens >= max_num_seqs: every running decode fits a step.
        self.max_running = min(self.max_running, self.token_budget)

    @property
    def max_num_batched_tokens(self) -> int:
        return self.token_budget

    def iteration_decodes(self, decodes: list[int]) -> list[int]:
        # Running requests are scheduled while budget remains: one token each.
        return decodes[:self.token_budget]

"""Earliest deadline first on the first-token deadline, under Sarathi-Serve's token budget.

The shape of the SLO-aware policy proposed for vLLM V1 (vllm-project/vllm#53571) and of deadline-aware
LLM schedulers generally: each iteration is Sarathi-Serve's (`sarathi.py`: every running decode, one token
each, then prompt chunks in the budget they leave, one packed forward, stall-free), but prompt chunks go
in order of the request's first-token deadline, arrival + its class's first-token target for its prompt
(`ServiceClass.first_token_target_ms`), instead of arrival order. A request whose class states no
first-token target has no deadline and goes after every one that has (in arrival order among themselves).

Resident partial prefills compete by deadline with waiting requests. A waiting request that cannot get a
slot, its pages or a `max_num_seqs` place ends admission for the iteration (no later deadline overtakes
it), but residents later in deadline order still get their chunks.
"""

from __future__ import annotations

import math

from helios.baselines.sarathi import SarathiScheduler
from helios.scheduler.plan import RequestHandle
from helios.scheduler.request_spec import RequestSpec

NS_PER_MS = 1_000_000


class EdfScheduler(SarathiScheduler):
    name = "edf"
    blocked_admission_ends_scan = False  # residents later in deadline order still get their chunks

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._deadline_ns: dict[int, float] = {}  # handle -> first-token deadline (inf: none)

    def admit(self, request: RequestSpec, now_ns: int) -> RequestHandle:
        handle = super().admit(request, now_ns)
        target = request.service_class.first_token_target_ms(request.prompt_tokens)
        self._deadline_ns[handle] = math.inf if target is None else now_ns + target * NS_PER_MS
        return handle

    def deadline_ns(self, handle: int) -> float:
        return self._deadline_ns.get(handle, math.inf)

    def prefill_candidates(self) -> list[int]:
        handles = self.requests.handle
        rows = self.resident_prefills() + self.waiting()
        return sorted(rows, key=lambda r: (self.deadline_ns(int(handles[r])), int(handles[r])))

"""EchoSimCore: the `flare run --engine sim` engine, for fast, deterministic HTTP tests.

A SimCore paced in real time whose output tokens repeat the prompt's bytes cyclically (with a
ByteTokenizer), so responses are predictable text; timing, acceptance and round sizes stay
SimCore's, under an affine cost model.
"""

from __future__ import annotations

import dataclasses
import threading
import time

from helios.config import SchedulerConfig
from helios.engine.byte_tokenizer import ByteTokenizer
from helios.engine.core import LOGPROBS_OPTION, PROMPT_LOGPROBS_OPTION, TokenLogprobs
from helios.engine.sim_core import SimCore
from helios.graphs import GraphKind
from helios.prepare import Capacities, build_catalog


class AffineCost:
    """decode ms = 2 + 0.05 B (+0.5 per extra verified position); prefill ms = 2 + 0.01 B C;
    mixed ms = the decode formula + 0.01 C for the prompt capacity."""

    def duration_ns(self, shape, context_lens) -> int:
        b = shape.batch_capacity
        if shape.kind.is_prefill:
            ms = 2 + 0.01 * b * shape.token_capacity
        else:
            ms = 2 + 0.05 * b + 0.5 * (shape.token_capacity - 1) + 0.01 * shape.prefill_capacity
        return int(ms * 1e6)


class EchoSimCore(SimCore):
    """SimCore paced in real time (`pace` real seconds per simulated second) whose output tokens
    repeat the prompt's bytes cyclically. It prepares the catalog of `capacities`."""

    def __init__(self, capacities: Capacities, *, request_slots: int, max_context: int, pace: float = 1.0):
        catalog = build_catalog(capacities)
        depth = max((s.proposal_depth for s in catalog.of_kind(GraphKind.SPECULATIVE)), default=0)
        self.draft_capacity = depth or 8  # the confidence sidecar's width, also without speculation
        self.tokenizer = ByteTokenizer()
        super().__init__(catalog, AffineCost(), seed=0, vocab=256, eos_id=self.tokenizer.eos_id,
                         request_slots=request_slots, draft_capacity=self.draft_capacity)
        self.capacities = capacities
        self.request_slots = request_slots
        self.max_context = max_context
        self.pace = pace
        self._prompts: dict[int, tuple[list[int], int]] = {}
        self._logprobs: dict[int, int] = {}  # handle -> top alternatives asked for
        self._scored: dict[int, tuple[list[int], int]] = {}  # handle -> (prompt, top alternatives)
        self._lock = threading.Lock()

    def scheduler_config(self, **overrides) -> SchedulerConfig:
        """A SchedulerConfig that matches this core's slots, context and speculation."""
        fields = dict(request_slots=self.request_slots, max_context=self.max_context,
                      speculation=self.capacities.speculation, draft_capacity=self.draft_capacity,
                      selection_slots=self.request_slots)
        return SchedulerConfig(**{**fields, **overrides})

    def attach(self, handle, prompt=0, **options) -> None:
        super().attach(handle, prompt)
        ids = [int(t) for t in prompt if int(t) < 256] or [ord("x")]
        self._prompts[handle] = (ids, 0)
        if options.get(LOGPROBS_OPTION) is not None:
            self._logprobs[handle] = options[LOGPROBS_OPTION]
        if options.get(PROMPT_LOGPROBS_OPTION) is not None:
            self._scored[handle] = (ids, options[PROMPT_LOGPROBS_OPTION])

    def detach(self, handle) -> None:
        super().detach(handle)
        self._prompts.pop(handle, None)
        self._logprobs.pop(handle, None)
        self._scored.pop(handle, None)

    def execute(self, plan, fence):
        with self._lock:
            execution = super().execute(plan, fence)
            records = tuple(dataclasses.replace(r, tokens=self._echo(r.handle, len(r.tokens)))
                            for r in execution.records)
            # The echo is certain: each token has log-probability 0 and is its own only alternative.
            logprobs = {r.handle: tuple(TokenLogprobs(0.0, ((t, 0.0),) if self._logprobs[r.handle] else ())
                                        for t in r.tokens) for r in records if r.handle in self._logprobs}
            scores = self._prompt_scores(plan) if plan.shape.kind is GraphKind.SCORED_PREFILL else None
        if self.pace:
            time.sleep(execution.duration_ns * self.pace / 1e9)
        return dataclasses.replace(execution, records=records, logprobs=logprobs or None, prompt_logprobs=scores)

    def _prompt_scores(self, plan) -> dict | None:
        # Each scored chunk at s..s+n-1 scores prompt tokens s+1..s+n, after None for token 0
        # (Execution.prompt_logprobs); the sim is certain of them too.
        out = {}
        for lane in plan.lanes:
            if lane.handle in self._scored:
                ids, top = self._scored[lane.handle]
                s, n = lane.prompt_start, lane.prompt_tokens
                tokens = ids[s + 1: min(s + n + 1, len(ids))]
                out[lane.handle] = ((None,) if s == 0 else ()) + tuple(
                    TokenLogprobs(0.0, ((t, 0.0),) if top else ()) for t in tokens)
        return out or None

    def _echo(self, handle, n: int) -> tuple[int, ...]:
        ids, pos = self._prompts.get(handle, ([ord("x")], 0))
        out = tuple(ids[(pos + i) % len(ids)] for i in range(n))
        self._prompts[handle] = (ids, pos + n)
        return out

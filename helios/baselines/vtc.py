"""VTC: fair scheduling across clients with virtual token counters.

Paper: Y. Sheng et al., "Fairness in Serving Large Language Models", OSDI 2024 (Algorithm 2,
VTC with continuous batching). Code: github.com/Ying1123/VTC-artifact,
`slora/server/router/vtc_req_queue.py` (`VTCReqQueue`) and the S-LoRA router loop in
`slora/server/router/manager.py` (`RouterManager._step`). The rules reproduced here:

- Each client (`RequestSpec.client`) has a counter c. Prompt tokens cost `input_weight`
  (w_p, default 1) and each generated token `output_weight` (w_q, default 2).
- Counter lift: when a request arrives for a client with no waiting request, its counter
  becomes max(c, min of the counters of the other clients that have waiting requests); with
  no such client it keeps its own (a new client starts at 0).
- Admission builds a new mini batch: repeatedly take the client with the smallest counter
  among clients with waiting requests, and admit its earliest request if it fits (a free
  slot and its page extent, `max_running`, and at most `batch_max_tokens` prompt tokens in
  the mini batch); charge c += w_p * prompt tokens at admission. The first request that does
  not fit ends the mini batch.
- Each decode step charges c += w_q per request in the running batch.
- Weighted VTC (the paper's weighted variant): a client's charges are divided by its weight, so a client
  of weight w gets w times the service of a weight-one client while both are backlogged. The client is the
  tenant (`RequestSpec.client`) and its weight `RequestSpec.tenant_weight` (default 1: unweighted VTC).
- The router loop (prefill-prioritizing, as in S-LoRA): with no running decode, admit and
  prefill a new mini batch; otherwise decode, and after `max_wait_steps` (S-LoRA's
  `max_wait_tokens`, 10) consecutive decode steps try a new mini batch before decoding again.

Mapping onto our catalog: S-LoRA prefills a mini batch in one unchunked forward; here it runs
as consecutive prefill graphs over the admitted rows (smallest shape covering every row, else
the widest chunk with enough rows) with no decode in between, and the whole uncached prompt is
charged when its first chunk is committed. Decode steps serve every running decode at the
smallest fitting bucket. One frame is in flight at a time. Ties between equal counters go to
the client whose earliest waiting request arrived first.
"""

from __future__ import annotations

from helios.baselines.common import BaselineScheduler, Rows, fit_rows, prefill_cap
from helios.config import PolicyConfig, SchedulerConfig
from helios.errors import ConfigError
from helios.graphs import Catalog, GraphKind, GraphShape
from helios.scheduler.plan import RequestHandle, ScheduledPlan
from helios.scheduler.request_spec import RequestSpec


class VTCScheduler(BaselineScheduler):
    name = "vtc"

    def __init__(self, catalog: Catalog, policy: PolicyConfig | None = None,
                 config: SchedulerConfig | None = None, *, input_weight: float = 1.0,
                 output_weight: float = 2.0, batch_max_tokens: int = 2048, max_wait_steps: int = 10):
        super().__init__(catalog, policy, config)
        for field, value in (("input_weight", input_weight), ("output_weight", output_weight)):
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value >= 0:
                raise ConfigError(field, f"must be a nonnegative number, got {value!r}")
        for field, value in (("batch_max_tokens", batch_max_tokens), ("max_wait_steps", max_wait_steps)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(field, f"must be a positive integer, got {value!r}")
        self.input_weight = float(input_weight)
        self.output_weight = float(output_weight)
        self.batch_max_tokens = batch_max_tokens
        self.max_wait_steps = max_wait_steps
        self.counters: dict[str, float] = {}
        self.decode_steps = 0  # consecutive decode steps since the last admission (has_wait_tokens)

    # ---- arrival: counter lift ---------------------------------------------------------
    def backlogged(self) -> dict[str, list[int]]:
        """Clients with waiting (not yet admitted) requests' rows, each list in arrival order."""
        out: dict[str, list[int]] = {}
        specs = self.requests.specs
        for r in self.waiting():
            out.setdefault(specs[r].client, []).append(r)
        return out

    def admit(self, request: RequestSpec, now_ns: int) -> RequestHandle:
        queues = self.backlogged()
        handle = super().admit(request, now_ns)  # raises before any counter changes
        client = request.client
        own = self.counters.get(client, 0.0)
        if client not in queues:
            others = [self.counters[c] for c in queues if c != client]
            own = max(own, min(others)) if others else own
        self.counters[client] = own
        return handle

    # ---- selection -----------------------------------------------------------------------
    def _select(self) -> tuple[GraphShape, Rows] | None:
        prefilling = self.resident_prefills()
        if prefilling:  # the admitted mini batch's prefill continues
            kind = self.prefill_kind(prefilling[0])
            rows = [r for r in prefilling if self.prefill_kind(r) is kind]
            return self._prefill(kind, rows)
        decodes = self.running_decodes()
        if not decodes or self.decode_steps >= self.max_wait_steps:
            batch = self.new_mini_batch()
            if batch:
                return self._prefill(self.prefill_kind(batch[0]), batch)
        return self.decode_rows(decodes)

    def _prefill(self, kind: GraphKind, rows: list[int]):
        fitted = fit_rows(self.shapes.prefill_of(kind), [self.prompt_left(r) for r in rows])
        if fitted is None:
            return None
        shape, tokens = fitted
        return shape, list(zip(rows, tokens))

    def new_mini_batch(self) -> list[int]:
        """Requests admitted by smallest counter first; counters here are a planning copy."""
        queues = self.backlogged()
        counters = dict(self.counters)
        slots, pages = self.resources.free_slots, self.resources.free_pages
        running, tokens, kind = self.resident_count(), 0, None
        batch: list[int] = []
        while queues:
            # Rows of one client are in arrival order; across clients, the handle orders them.
            client = min(queues, key=lambda c: (counters.get(c, 0.0), int(self.requests.handle[queues[c][0]])))
            r = queues[client][0]
            need = self.extent_pages(r)
            left = self.prompt_left(r)
            k = self.prefill_kind(r)
            fits = (slots > 0 and need <= pages and running < self.max_running
                    and (kind is None or k is kind)
                    and prefill_cap(self.shapes.prefill_of(k), len(batch) + 1) > 0
                    and (not batch or tokens + left <= self.batch_max_tokens))
            if not fits:
                break
            batch.append(r)
            slots, pages, running, tokens, kind = slots - 1, pages - need, running + 1, tokens + left, k
            counters[client] = counters.get(client, 0.0) + self.input_weight * left / self.requests.specs[r].tenant_weight
            queues[client].pop(0)
            if not queues[client]:
                del queues[client]
        return batch

    # ---- charging ------------------------------------------------------------------------
    def _on_commit(self, plan: ScheduledPlan) -> dict:
        if plan.shape.kind is GraphKind.DECODE:
            t = self.requests
            for lane in plan.lanes:
                spec = t.specs[t.row(lane.handle)]
                charge = self.output_weight * lane.output_rows / spec.tenant_weight
                self.counters[spec.client] = self.counters.get(spec.client, 0.0) + charge
            self.decode_steps += 1
        else:
            admitted = False
            t = self.requests
            for lane in plan.lanes:
                spec = t.specs[t.row(lane.handle)]
                if lane.prompt_start == spec.cached_tokens:  # first chunk: admission
                    charge = self.input_weight * (spec.prompt_tokens - spec.cached_tokens) / spec.tenant_weight
                    self.counters[spec.client] = self.counters.get(spec.client, 0.0) + charge
                    admitted = True
            if admitted:
                self.decode_steps = 0
        return {"counters": dict(self.counters)}

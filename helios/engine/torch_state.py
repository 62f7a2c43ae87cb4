"""TorchCore's per-request state and the role validation of plans against it.

A plan's lanes are checked against the core's own record of every request before anything is
packed or the cache is touched; a lane that disagrees raises PlanMismatch.

Slots: the scheduler assigns a request's slot at the commit of its first plan, so the frozen
lanes of that first plan carry slot None. The core therefore binds each request to a physical
KV slot of its own on the request's first work and releases it at detach; a lane's scheduler
slot, once seen, must stay the same. Only a request's first prefill chunk may carry slot None.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch

from helios.engine.grammar import Constraint
from helios.engine.proposals import copy_proposals
from helios.engine.sampling import SamplingOptions
from helios.errors import HeliosError, InvalidRequest
from helios.graphs import GraphKind
from helios.scheduler.plan import Lane, ScheduledPlan


class PlanMismatch(HeliosError, ValueError):
    """A plan whose lanes disagree with the core's request state; nothing was executed."""


@dataclass(frozen=True, slots=True)
class Stopping:
    """Which sampled token ids end a request (`terminal`: EOS unless ignored, plus any stop token
    ids), and how many outputs must come before one may be sampled (`min_tokens`)."""

    terminal: frozenset[int]
    min_tokens: int = 0

    @classmethod
    def of(cls, eos_id: int, vocab_size: int, ignore_eos=False, min_tokens=None, stop_token_ids=None) -> Stopping:
        """Validate attach() stopping options (vLLM's ignore_eos, min_tokens, stop_token_ids)."""
        if not isinstance(ignore_eos, bool):
            raise InvalidRequest(f"ignore_eos must be a boolean, got {ignore_eos!r}")
        if min_tokens is not None and (isinstance(min_tokens, bool) or not isinstance(min_tokens, int)
                                       or min_tokens < 0):
            raise InvalidRequest(f"min_tokens must be a nonnegative integer, got {min_tokens!r}")
        ids = tuple(stop_token_ids or ())
        if any(isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab_size for t in ids):
            raise InvalidRequest(f"stop_token_ids must be token ids in [0, {vocab_size}), got {list(ids)!r}")
        return cls(frozenset(ids) | (frozenset() if ignore_eos else {eos_id}), min_tokens or 0)

    def blocks(self, produced: int) -> bool:
        """Whether the next output (after `produced` of them) may not be a terminal token."""
        return produced < self.min_tokens and bool(self.terminal)

    def first_terminal(self, tokens) -> int | None:
        return next((i for i, t in enumerate(tokens) if t in self.terminal), None)


@dataclass(slots=True)
class CoreRequest:
    """One attached request as the core knows it."""

    handle: int
    prompt: tuple[int, ...]
    options: SamplingOptions
    generator: torch.Generator
    slot: int | None = None  # physical KV slot, bound at the request's first work
    scheduler_slot: int | None = None  # the scheduler's slot id, once a lane carried one
    kv_len: int = 0  # valid KV entries: consumed prompt, then committed outputs but the pending one
    generated: list[int] = field(default_factory=list)  # sampled tokens; the last is pending
    stopping: Stopping = Stopping(frozenset())  # TorchCore.attach always sets EOS and the options
    logprobs: int | None = None  # top alternatives to report per output token; None: no log-probabilities
    prompt_logprobs: int | None = None  # the same for the prompt's tokens (scored prefill)
    constraint: Constraint | None = None  # a response format's grammar (helios.engine.grammar)

    @property
    def pending(self) -> int | None:
        """The last sampled token: not yet in the cache, fed by the next decode or round."""
        return self.generated[-1] if self.generated else None

    def context(self) -> list[int]:
        """Prompt plus every generated token (the pending one last): proposals copy from it."""
        return list(self.prompt) + self.generated


@dataclass(frozen=True, slots=True)
class LaneWork:
    """A validated lane: the request, its physical slot and what the row computes."""

    lane: Lane
    request: CoreRequest
    slot: int
    new_slot: bool  # the slot is bound by this execution
    finishes_prompt: bool = False  # prefill: the chunk ends the prompt and samples a token

    def drafts(self) -> list[int]:
        """Copy proposals for the lane's extra rows. A constrained request gets none: its grammar
        masks each position given the tokens before it, which a draft would skip."""
        if self.request.constraint is not None:
            return []
        return copy_proposals(self.request.context(), self.lane.output_rows - 1)


def validate_plan(plan: ScheduledPlan, requests: dict[int, CoreRequest], free_slots: Sequence[int],
                  catalog, max_context: int) -> list[LaneWork]:
    """Check every lane of `plan` against the core's state; raise PlanMismatch on the first
    disagreement. Returns one LaneWork per lane, in lane order, binding free slots in order."""
    shape = plan.shape
    if shape not in catalog:
        raise PlanMismatch(f"{shape.label()} is not a prepared graph of this core")
    if not plan.lanes:
        raise PlanMismatch("a plan needs at least one lane")
    if len(plan.lanes) > shape.batch_capacity:
        raise PlanMismatch(f"{len(plan.lanes)} lanes exceed batch capacity {shape.batch_capacity}")
    if shape.kind in (GraphKind.SPECULATIVE, GraphKind.MIXED) and plan.device_allocation:
        raise PlanMismatch("TorchCore allocates target rows on the host only (fixed speculation)")
    prompt_rows = _prompt_rows(plan)
    free = list(free_slots)
    seen_handles, seen_slots, works = set(), set(), []
    for lane in plan.lanes:
        r = requests.get(lane.handle)
        if r is None:
            raise PlanMismatch(f"request {lane.handle} is not attached to this core")
        if lane.handle in seen_handles:
            raise PlanMismatch(f"request {lane.handle} appears twice in one plan")
        seen_handles.add(lane.handle)
        if lane.slot is not None:
            if lane.slot in seen_slots:
                raise PlanMismatch(f"slot {lane.slot} appears twice in one plan")
            seen_slots.add(lane.slot)
            if r.scheduler_slot is not None and lane.slot != r.scheduler_slot:
                raise PlanMismatch(f"request {lane.handle}: lane slot {lane.slot}, but the request "
                                   f"runs in scheduler slot {r.scheduler_slot}")
        elif r.slot is not None or r.kv_len or not lane.prompt_tokens:
            raise PlanMismatch(f"request {lane.handle}: slot None on a resident request "
                               "(only a first prefill chunk may precede slot assignment)")
        if r.slot is None:
            if not free:
                raise PlanMismatch(f"request {lane.handle}: no free KV slot (detach finished requests)")
            slot, new = free.pop(), True
        else:
            slot, new = r.slot, False
        if len(works) in prompt_rows:
            works.append(_check_prefill(lane, r, shape, max_context, slot, new))
        else:
            works.append(_check_decode(lane, r, shape, max_context, slot, new))
    return works


def _prompt_rows(plan: ScheduledPlan) -> frozenset[int]:
    """Indices of the lanes that consume prompt tokens: every lane of a prefill plan (packed by prefix
    sums within B x C), the prompt rows of a mixed plan (up to the shape's prompt_rows, packed by prefix
    sums within C together; ScheduledPlan already holds a mixed plan to them and its decode rows
    within W)."""
    shape, prompt = plan.shape, plan.lanes.prompt_tokens.tolist()
    if shape.kind.is_prefill:
        capacity, rows = shape.batch_capacity * shape.token_capacity, range(len(prompt))
    elif shape.kind is GraphKind.MIXED:
        capacity, rows = shape.prefill_capacity, plan.prefill_rows
    else:
        return frozenset()  # _check_decode names stray prompt tokens
    if sum(prompt) > capacity:
        raise PlanMismatch(f"{sum(prompt)} prompt tokens exceed {shape.label()}'s packed capacity {capacity}")
    return frozenset(rows)


def _check_prefill(lane: Lane, r: CoreRequest, shape, max_context: int, slot: int, new: bool) -> LaneWork:
    h, start, n = lane.handle, lane.prompt_start, lane.prompt_tokens
    if r.generated:
        raise PlanMismatch(f"request {h}: prefill after its prompt was consumed")
    # Prefill rows and a mixed graph's prompt rows are packed by prefix sums (the plan's total is
    # checked once, in _prompt_rows); one mixed prompt row holds up to prefill_capacity tokens.
    capacity = shape.prefill_capacity if shape.kind is GraphKind.MIXED else shape.batch_capacity * shape.token_capacity
    if not 1 <= n <= capacity:
        raise PlanMismatch(f"request {h}: {n} prompt tokens in a {capacity}-token chunk")
    if start != r.kv_len or lane.context_tokens != r.kv_len:
        raise PlanMismatch(f"request {h}: prefill from prompt offset {start} with context "
                           f"{lane.context_tokens}, but the core holds {r.kv_len} tokens")
    if start + n > len(r.prompt):
        raise PlanMismatch(f"request {h}: prompt range [{start}, {start + n}) is beyond its "
                           f"{len(r.prompt)}-token prompt")
    finishes = start + n == len(r.prompt)
    if lane.output_rows != int(finishes):
        raise PlanMismatch(f"request {h}: {lane.output_rows} output rows for a chunk that "
                           f"{'finishes' if finishes else 'does not finish'} the prompt")
    if start + n > max_context:
        raise PlanMismatch(f"request {h}: prompt end {start + n} exceeds context {max_context}")
    return LaneWork(lane, r, slot, new, finishes)


def _check_decode(lane: Lane, r: CoreRequest, shape, max_context: int, slot: int, new: bool) -> LaneWork:
    h, rows = lane.handle, lane.output_rows
    if r.pending is None:
        raise PlanMismatch(f"request {h}: decoding before its prompt was consumed")
    if lane.prompt_tokens:
        raise PlanMismatch(f"request {h}: {lane.prompt_tokens} prompt tokens in a "
                           f"{shape.kind.value} graph")
    if not 1 <= rows <= shape.token_capacity:
        raise PlanMismatch(f"request {h}: {rows} output rows in a graph of width {shape.token_capacity}")
    # The pending token sits at position kv_len, so the lane's context counts it. A round
    # queued behind another round plans with that round's ceiling: an upper bound.
    exact = shape.kind is GraphKind.DECODE or (shape.kind is GraphKind.MIXED and not shape.proposal_depth)
    if (lane.context_tokens != r.kv_len + 1) if exact else (lane.context_tokens < r.kv_len + 1):
        raise PlanMismatch(f"request {h}: lane context {lane.context_tokens}, but the core holds "
                           f"{r.kv_len} tokens plus the pending one")
    if r.kv_len + rows > max_context:
        raise PlanMismatch(f"request {h}: {rows} rows from position {r.kv_len} exceed context {max_context}")
    return LaneWork(lane, r, slot, new)

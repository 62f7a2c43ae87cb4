"""TorchCore's state operations: SNAPSHOT and RESTORE graphs over the checkpoint store.

A SNAPSHOT lane names a resident request; it copies the slot's first `kv_len` positions to the
host, offers that copy to the shared store (keyed by the tokens that produced them: a terminal
capture a later turn can restore), keeps it as the request's private resume copy, and frees the
slot: the request's state now lives in the copy. A terminal request is detached right after (the
private copy goes with it); a preempted one is resumed later by a RESTORE from its private copy,
which cannot be evicted, so preemption never loses state.

A RESTORE lane binds a fresh KV slot and copies into it either the request's private resume copy
or, for a new request, its guarded store match (`tokens` positions); the request's cursor is set
there, so the following prefill chunk or decode starts at that exact endpoint. Neither graph
produces tokens.

An anchor SNAPSHOT (`plan.anchor`, a nonterminal cut at a message endpoint or the prompt end)
copies the first `kv_len` positions to the store as an ANCHOR entry and keeps the slot: the
request continues prefilling or decoding, and no resume copy is kept.
"""

from __future__ import annotations

from helios.engine.torch_checkpoints import CheckpointRole, CheckpointStore, Match
from helios.engine.torch_state import CoreRequest, PlanMismatch
from helios.graphs import Catalog, GraphKind, GraphShape
from helios.scheduler.plan import CompletionRecord, ScheduledPlan

STATE_KINDS = (GraphKind.SNAPSHOT, GraphKind.RESTORE)
# One request per copy: a copy's cost grows with its tokens, not with a batch dimension.
STATE_SHAPES = (GraphShape(GraphKind.SNAPSHOT, 1), GraphShape(GraphKind.RESTORE, 1))


def with_state_shapes(catalog: Catalog) -> Catalog:
    """The inference catalog plus the state-operation graphs a checkpoint store enables."""
    return Catalog(list(catalog) + list(STATE_SHAPES))


def validate_state_plan(plan: ScheduledPlan, requests: dict[int, CoreRequest], restores: dict[int, Match],
                        resumable: dict, free_slots: list[int]) -> list[tuple]:
    """Check every lane before any copy; returns (lane, request, slot) triples."""
    kind, out = plan.shape.kind, []
    free = list(free_slots)
    if not plan.lanes or len(plan.lanes) > plan.shape.batch_capacity:
        raise PlanMismatch(f"{len(plan.lanes)} lanes for a {plan.shape.label()} graph")
    for lane in plan.lanes:
        r = requests.get(lane.handle)
        if r is None:
            raise PlanMismatch(f"request {lane.handle} is not attached to this core")
        if lane.prompt_tokens or lane.output_rows:
            raise PlanMismatch(f"request {lane.handle}: a {kind.value} lane consumes and produces nothing")
        if kind is GraphKind.RESTORE:
            own = resumable.get(lane.handle)
            match = restores.get(lane.handle)
            tokens = own[0].shape[2] if own is not None else match.tokens if match is not None else None
            if tokens is None or r.slot is not None or r.kv_len:
                raise PlanMismatch(f"request {lane.handle}: restore without a resume copy or checkpoint match")
            if lane.context_tokens != tokens:
                raise PlanMismatch(f"request {lane.handle}: restore of {lane.context_tokens} tokens, "
                                   f"but its checkpoint holds {tokens}")
            if not free:
                raise PlanMismatch(f"request {lane.handle}: no free KV slot for the restore")
            out.append((lane, r, free.pop()))
        else:
            if r.slot is None:
                raise PlanMismatch(f"request {lane.handle}: snapshot of a request with no KV slot")
            # A decode frame queued behind the request's last one may have run past its finish, so the
            # core can hold more than the endpoint; positions before it are exact (causal), never fewer.
            if not 0 < lane.context_tokens <= r.kv_len:
                raise PlanMismatch(f"request {lane.handle}: snapshot endpoint {lane.context_tokens}, but the "
                                   f"core holds {r.kv_len} tokens")
            out.append((lane, r, r.slot))
    return out


def run_state_plan(core, plan: ScheduledPlan) -> tuple[CompletionRecord, ...]:
    """Execute a validated SNAPSHOT or RESTORE plan on `core` (a TorchCore with a store)."""
    store: CheckpointStore = core.checkpoints
    works = validate_state_plan(plan, core.requests, core.pending_restores, core.resumable, core._free_slots)
    cache = core.cache
    for lane, r, slot in works:
        if plan.shape.kind is GraphKind.RESTORE:
            own = core.resumable.pop(lane.handle, None)
            if own is not None:
                n = own[0].shape[2]
                cache.k[:, slot, :, :n].copy_(own[0])
                cache.v[:, slot, :, :n].copy_(own[1])
            else:
                match = core.pending_restores.pop(lane.handle)
                n = match.tokens
                try:
                    store.load(match.entry, n, cache.k[:, slot], cache.v[:, slot])
                finally:
                    store.release(match.entry)
            core._free_slots.remove(slot)
            # The scheduler slot of a restored request is bound at the restore's commit: the next
            # lane names it.
            r.slot, r.kv_len, r.scheduler_slot = slot, n, lane.slot
        elif plan.anchor:
            # A nonterminal cut: publish the exact prefix, keep the slot; without room the copy is
            # skipped (the store counts it) and the request simply continues.
            n = lane.context_tokens
            store.save(r.context()[:n], cache.k[:, slot, :, :n], cache.v[:, slot, :, :n], CheckpointRole.ANCHOR)
        else:
            n = lane.context_tokens
            tokens = r.context()[:n]  # prompt, then the committed outputs up to the endpoint
            k = cache.k[:, slot, :, :n].to("cpu", copy=True)
            v = cache.v[:, slot, :, :n].to("cpu", copy=True)
            store.save(tokens, k, v, CheckpointRole.TERMINAL, copy=False)
            core.resumable[lane.handle] = (k, v)
            core._free_slots.append(slot)
            r.slot, r.kv_len, r.scheduler_slot = None, 0, None
    return tuple(CompletionRecord(lane.handle, lane.epoch, 0, ()) for lane, _, _ in works)


def time_state_copy(core, shape: GraphShape, context: int) -> None:
    """A representative copy for warm-up timing: `context` positions of the scratch slot out to
    the host and back (touches no request state and no store entry)."""
    n = max(1, min(context, core.cache.max_context))
    slot = core.cache.scratch_slot
    k, v = core.cache.k[:, slot, :, :n].to("cpu", copy=True), core.cache.v[:, slot, :, :n].to("cpu", copy=True)
    if shape.kind is GraphKind.RESTORE:
        core.cache.k[:, slot, :, :n].copy_(k)
        core.cache.v[:, slot, :, :n].copy_(v)

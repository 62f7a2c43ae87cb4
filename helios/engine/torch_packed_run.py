"""TorchCore's packed executions: a mixed graph (prompt rows with decode or copy-speculative rows)
or a prefill plan whose rows need packing runs as ONE packed forward laid out by prefix sums
(torch_packed), and a mixed graph is timed on scratch rows. Functions of the core, as
torch_state_ops is for state plans."""

from __future__ import annotations

import dataclasses

import torch

from helios.config import SpeculationMode
from helios.engine.core import Execution
from helios.engine.torch_graphs import PAD_TOKEN, DeviceTimer, RowWork
from helios.engine.grammar import row_errors
from helios.engine.torch_outputs import aligned_logprobs, prompt_scores, sample_outputs, verify_outputs
from helios.engine.torch_packed import PackedGraph
from helios.engine.torch_state import LaneWork
from helios.graphs import GraphKind
from helios.scheduler.plan import ExecutionTiming, ScheduledPlan


def packed_graph(core, shape) -> PackedGraph:
    if shape not in core.packed:
        core.packed[shape] = PackedGraph(shape, core.cache.scratch_slot, core.device)
    return core.packed[shape]


def execute_packed(core, plan: ScheduledPlan, works: list[LaneWork]) -> Execution:
    """A mixed graph (its prompt rows, decode or copy-speculative rows) or a prefill plan whose rows
    need packing, as ONE packed forward laid out by prefix sums (torch_packed)."""
    graph = packed_graph(core, plan.shape)
    timer = DeviceTimer(core.device)
    prompt = frozenset(i for i, w in enumerate(works) if w.lane.prompt_tokens)
    # Decode rows verify like a speculative round's lanes when the core speculates (copy proposals;
    # width one verifies the pending token alone), else they sample one token.
    verify = core.speculation is not SpeculationMode.OFF
    drafts = [w.drafts() if verify and i not in prompt
              else [] for i, w in enumerate(works)]
    rows = [RowWork(w.slot, w.request.prompt[w.lane.prompt_start: w.lane.prompt_start + w.lane.prompt_tokens],
                    w.lane.prompt_start, w.finishes_prompt) if i in prompt
            else RowWork(w.slot, (w.request.pending, *d), w.request.kv_len, True)
            for i, (w, d) in enumerate(zip(works, drafts))]
    packing = graph.pack(rows, prompt)
    lps: dict = {}
    scores = None
    with torch.inference_mode():
        if plan.shape.kind is GraphKind.SCORED_PREFILL:  # a prefill: no verified rows below
            every = graph.forward(core.model, core.cache, every_position=True)  # [T, V]
            offsets = packing.offsets
            scores = prompt_scores(works, lambda b: every[offsets[b]:offsets[b + 1]])
            logits = every[graph.buffers["logits_at"]]
        else:
            logits = graph.forward(core.model, core.cache)  # [B, S, V] at each row's sampled positions
        # The row sampling mask: each prompt row samples only when it finishes; verified rows sample below.
        mask = tuple(m and not (verify and b < len(works) and b not in prompt)
                     for b, m in enumerate(packing.sample_mask))
        outputs = sample_outputs(works, logits[:, 0], dataclasses.replace(packing, sample_mask=mask), lps)
        if verify:
            decoders = [i for i in range(len(works)) if i not in prompt]
            verified = verify_outputs([works[i] for i in decoders], [drafts[i] for i in decoders],
                                    logits[decoders], lps)
            for i, out in zip(decoders, verified):
                outputs[i] = out
    duration = timer.stop()
    core.last_packing = packing
    offered = [len(d) if verify and i not in prompt else None for i, d in enumerate(drafts)]
    records = tuple(core._commit(w, out, k) for w, out, k in zip(works, outputs, offered))
    return Execution(records, ExecutionTiming((duration,), None, None), duration,
                     logprobs=aligned_logprobs(records, lps), prompt_logprobs=scores, row_errors=row_errors(works))


def time_packed(core, shape, context: int) -> int:
    """Time a mixed graph on scratch rows only: a full prompt row and full decode rows (the maximum
    packed extent, which several prompt rows sharing C never exceed)."""
    graph = packed_graph(core, shape)
    w, c = shape.token_capacity, shape.prefill_capacity
    start = max(0, min(context, core.cache.max_context - c))
    scratch = core.cache.scratch_slot
    rows = [RowWork(scratch, (PAD_TOKEN,) * c, start, True)]
    rows += [RowWork(scratch, (PAD_TOKEN,) * w, start, True)] * (shape.batch_capacity - 1)
    timer = DeviceTimer(core.device)
    graph.pack(rows, frozenset({0}))
    with torch.inference_mode():
        graph.forward(core.model, core.cache)[:, 0].argmax(-1).tolist()
    return timer.stop()

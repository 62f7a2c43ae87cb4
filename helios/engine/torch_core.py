"""TorchCore: the real model behind the scheduler.

It loads a Llama-family GGUF (SmolLM2-135M-Instruct by default) through helios.engine.model,
prepares one static-shape graph per catalog shape (torch_graphs), keeps each request's state
(prompt, sampling options and generator, pending token, committed length; torch_state), and
executes plans: prefill chunks, ordinary decode, and complete speculative rounds with copy
proposals verified losslessly (sampling, proposals). Mixed graphs (prompt chunks and decode rows)
and prefill plans whose rows need packing run as one packed forward (torch_packed, run by
torch_packed_run).

Speculative KV invariant: a round writes K/V for the pending token and every draft. Only the
pending token and the accepted drafts become valid (kv_len advances past them); the entries of
rejected drafts sit at positions >= the new kv_len. The next execution of that request writes
its own tokens from position kv_len on before any of its queries attends there, and queries
attend only to positions <= their own, so stale entries are never read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from helios.config import SchedulerConfig, SpeculationMode
from helios.engine.cpu_threads import TorchThread
from helios.engine.core import LOGPROBS_OPTION, MAX_LOGPROBS, PROMPT_LOGPROBS_OPTION, Execution
from helios.engine.grammar import GRAMMAR_OPTION, Constraint, grammar_tokenizer, row_errors
from helios.engine.model import (KVCache, LlamaModel, ModelConfig, Tokenizer, WeightFormat, load_tokenizer,
                                 load_weights)
from helios.engine.model.loader import load_quantized
from helios.engine.model.weights import bf16_available
from helios.engine.sampling import SamplingOptions
from helios.engine.torch_outputs import aligned_logprobs, prompt_scores, sample_outputs, verify_outputs
from helios.engine.torch_checkpoints import CheckpointStore, Match
from helios.engine.torch_graphs import PAD_TOKEN, DeviceTimer, Packing, PreparedGraph, RowWork
from helios.engine.torch_packed import needs_packing
from helios.engine.torch_packed_run import execute_packed, time_packed
from helios.engine.torch_state_ops import STATE_KINDS, run_state_plan, time_state_copy, with_state_shapes
from helios.engine.torch_state import CoreRequest, LaneWork, PlanMismatch, Stopping, validate_plan
from helios.errors import ConfigError, InvalidRequest
from helios.graphs import Catalog, GraphKind
from helios.prepare import Capacities, build_catalog
from helios.prepare.mixed import PROMPT_STEPS
from helios.scheduler.plan import CompletionRecord, ExecutionTiming, Fence, RequestHandle, ScheduledPlan

__all__ = ["LoadedModel", "PlanMismatch", "TorchCore", "load_model"]

SAMPLING_OPTIONS = ("temperature", "top_p", "top_k", "min_p", "seed", "presence_penalty", "frequency_penalty",
                    "repetition_penalty", "logit_bias", "allowed_token_ids")
# A guarded checkpoint match (CheckpointStore.match) to restore before the suffix is prefilled.
RESTORE_OPTION = "checkpoint"
# vLLM's stopping extensions: generate past EOS, no EOS or stop token before min_tokens, extra
# token ids that end a request like EOS does.
STOPPING_OPTIONS = ("ignore_eos", "min_tokens", "stop_token_ids")


@dataclass(frozen=True, slots=True)
class LoadedModel:
    """Config, model and tokenizer of one checkpoint; several cores may share one."""

    config: ModelConfig
    model: LlamaModel
    tokenizer: Tokenizer
    device: torch.device


def load_model(model_path=None, device: str | torch.device = "cpu",
               weights: WeightFormat | str = WeightFormat.FLOAT32) -> LoadedModel:
    """Load a Llama-family GGUF (default: the bundled SmolLM2) onto `device` in float32 (or on the
    CPU with the file's own quantized weights, `gguf`, or bf16 or int8 linear weights: faster,
    different tokens; helios.engine.model.weights)."""
    device = torch.device(device)
    fmt = WeightFormat(weights)
    if fmt is not WeightFormat.FLOAT32 and device.type != "cpu":
        raise ConfigError("weights", f"{fmt.value} weights are a CPU format; use fp32 on other devices")
    if fmt is WeightFormat.BF16 and not bf16_available():
        raise ConfigError("weights", "bf16 weights need a CPU that multiplies bfloat16 natively "
                                     "(AMX or AVX512-BF16); use fp32 or int8 here")
    config, weights = load_weights(model_path)
    quantized = load_quantized(model_path) if fmt is WeightFormat.GGUF else None
    # oneDNN-packed weights are a CPU layout; CUDA uses plain ones.
    model = LlamaModel(config, weights, pack_weights=device.type == "cpu", weight_format=fmt,
                       quantized=quantized).to(device).eval()
    del quantized
    del weights
    return LoadedModel(config, model, load_tokenizer(model_path), device)


class TorchCore:
    """A Core (helios.engine.core) running a real model with static-shape prepared graphs."""

    grammars = True  # honours GRAMMAR_OPTION (a response format's grammar; helios.engine.grammar)

    def __init__(self, model_path=None, *, request_slots: int = 4, max_context: int = 1024,
                 prefill_chunks: Sequence[int] = (64, 256), max_batch: int = 4,
                 speculation: SpeculationMode | str = SpeculationMode.OFF,
                 widths: Sequence[int] = (1, 2, 4), speculative_token_capacity: int = 16,
                 num_threads: int | None = None, device: str | torch.device = "cpu",
                 loaded: LoadedModel | None = None, weights: WeightFormat | str = WeightFormat.FLOAT32,
                 torch_thread: TorchThread | None = None,
                 mixed_prefill: bool = False, checkpoint_memory: int = 0, mixed_prompt_steps: int = PROMPT_STEPS,
                 mixed_prompt_capacity: int | None = None, scored_prefill: bool = False, mixed_prompt_rows: int = 1):
        speculation = SpeculationMode(speculation)
        if request_slots < 1 or max_batch < 1:
            raise ConfigError("request_slots", "request_slots and max_batch must be positive")
        # On the CPU every model call runs on one thread, with a governed thread count (cpu_threads).
        # A caller that built `loaded` on a TorchThread passes that thread, so the process keeps one
        # OpenMP pool (helios.engine.sharding does, for a tensor-parallel shard).
        if torch_thread is None and torch.device(device).type == "cpu":
            torch_thread = TorchThread(num_threads)
        self.torch_thread = torch_thread
        self.loaded = loaded or self._on_torch(load_model, model_path, device, weights)
        self.device = self.loaded.device
        self.config, self.model, self.tokenizer = self.loaded.config, self.loaded.model, self.loaded.tokenizer
        self.speculation = speculation
        # Fixed speculation verifies one width; adaptive lets every prepared width compete.
        # Copy proposals carry no device confidence, so both allocate rows on the host (no ragged).
        chosen = (max(widths),) if speculation is SpeculationMode.FIXED else tuple(widths)
        # Mixed graphs only when asked (flare run --mixed-prefill), so existing catalogs stay as they are.
        mixed = {"mixed_prefill": True, "mixed_prompt_steps": mixed_prompt_steps,
                 "mixed_prompt_capacity": mixed_prompt_capacity, "mixed_prompt_rows": mixed_prompt_rows} \
            if mixed_prefill else {}
        # Scored prefill graphs (logits at every prompt position) serve requests for the prompt's
        # log-probabilities; the scheduler runs only those requests' prompts in them.
        self.capacities = Capacities(max_batch, tuple(prefill_chunks), speculation=speculation, widths=chosen,
                                     speculative_token_capacity=speculative_token_capacity, ragged=False,
                                     scored_prefill=scored_prefill, **mixed)
        catalog = build_catalog(self.capacities)
        self.catalog: Catalog = catalog
        # A row's padded tail runs up to (graph length - 1) positions past its real tokens, so
        # the cache keeps that margin beyond the usable context.
        margin = max(s.token_capacity for s in catalog) - 1
        self.max_context = min(max_context, self.config.max_context - margin)
        if self.max_context < 2:
            raise ConfigError("max_context", f"leaves no usable context next to a {margin}-token margin")
        with torch.device(self.device):
            self.cache = KVCache(self.config, request_slots, self.max_context + margin)
        self.request_slots = request_slots
        self.graphs = {s: PreparedGraph(s, self.cache.scratch_slot, self.device) for s in catalog
                       if s.kind is not GraphKind.MIXED}
        # Packed graphs (mixed shapes, prefill shapes whose rows need packing) run eagerly: their
        # per-row attention follows the query lengths, which a CUDA graph would freeze. Built on first use.
        self.packed: dict = {}
        # A checkpoint store (checkpoint_memory bytes) adds SNAPSHOT and RESTORE graphs.
        self.checkpoints = CheckpointStore(checkpoint_memory) if checkpoint_memory else None
        self.pending_restores: dict[RequestHandle, Match] = {}
        # Private K/V copies of snapshotted requests (preempted ones resume from them).
        self.resumable: dict[RequestHandle, tuple[torch.Tensor, torch.Tensor]] = {}
        if self.checkpoints is not None:
            self.catalog = with_state_shapes(catalog)
        self.captured = self.device.type == "cuda" and all(
            [g.capture(self.model, self.cache) for g in self.graphs.values()])
        self.requests: dict[RequestHandle, CoreRequest] = {}
        self._free_slots = list(range(request_slots - 1, -1, -1))  # pop() gives slot 0 first
        self.last_packing: Packing | None = None
        self._lltokenizer = None  # prepare_grammars

    def prepare_grammars(self):
        """llguidance's view of the tokenizer, built on the first call (0.3 s for SmolLM2). A server
        calls it before serving, so that its first constrained request does not stall every stream."""
        if self._lltokenizer is None:
            self._lltokenizer = grammar_tokenizer(self.tokenizer, self.config.vocab_size)
        return self._lltokenizer

    def scheduler_config(self, **overrides) -> SchedulerConfig:
        """A SchedulerConfig that matches this core's slots, context and speculation."""
        spec = [s.proposal_depth for s in self.catalog.of_kind(GraphKind.SPECULATIVE)]
        fields = dict(request_slots=self.request_slots, max_context=self.max_context,
                      speculation=self.speculation, copy_proposals=bool(spec),
                      draft_capacity=max(spec, default=0) or 8)
        return SchedulerConfig(**{**fields, **overrides})

    def _on_torch(self, fn, *args):
        return fn(*args) if self.torch_thread is None else self.torch_thread.call(fn, *args)

    def time_graph(self, shape, context: int = 0) -> int:
        """Run the prepared graph `shape` once on padding rows only (the scratch slot: no request
        state changes) with every row's queries from KV position `context` on, and return the
        measured interval in ns (see helios.server.warmup for how a server seeds costs)."""
        return self._on_torch(self._time_graph, shape, context)

    def _time_graph(self, shape, context: int) -> int:
        if shape.kind is GraphKind.MIXED:
            return time_packed(self, shape, context)
        if shape.kind in STATE_KINDS:
            timer = DeviceTimer(self.device)
            time_state_copy(self, shape, context)
            return timer.stop()
        graph = self.graphs[shape]
        start = max(0, min(context, self.cache.max_context - graph.length))
        rows = [RowWork(self.cache.scratch_slot, (PAD_TOKEN,) * graph.length, start, True)] * graph.batch
        timer = DeviceTimer(self.device)
        graph.pack(rows)
        with torch.inference_mode():
            logits = graph.forward(self.model, self.cache)
            logits[:, -1].argmax(-1).tolist()
        return timer.stop()

    def warmup(self, repeats: int = 2) -> dict:
        """Run every prepared graph `repeats` times on padding rows only and return each shape's
        fastest interval in ns."""
        return {shape: min(self.time_graph(shape) for _ in range(repeats)) for shape in self.catalog}

    # ---- requests ------------------------------------------------------------------------------
    def attach(self, handle: RequestHandle, prompt: Sequence[int], **options) -> None:
        """Attach a request. A `checkpoint` option (a guarded CheckpointStore match) makes its
        first work a RESTORE; the core owns that guard from here on, even when attach fails."""
        match = options.get(RESTORE_OPTION)
        try:
            self._attach(handle, prompt, **options)
        except BaseException:
            if isinstance(match, Match) and self.checkpoints is not None:
                self.checkpoints.release(match.entry)
            raise

    def _attach(self, handle: RequestHandle, prompt: Sequence[int], **options) -> None:
        extra = (RESTORE_OPTION, LOGPROBS_OPTION, PROMPT_LOGPROBS_OPTION, GRAMMAR_OPTION)
        unknown = set(options) - set(SAMPLING_OPTIONS) - set(STOPPING_OPTIONS) - set(extra)
        if unknown:
            raise InvalidRequest(f"unknown TorchCore options {sorted(unknown)}; "
                                 f"it takes {', '.join(SAMPLING_OPTIONS + STOPPING_OPTIONS + extra)}")
        if handle in self.requests:
            raise InvalidRequest(f"request {handle} is already attached")
        if isinstance(prompt, (int, str, bytes)) or not len(prompt):
            raise InvalidRequest("TorchCore needs the prompt's token ids (a nonempty sequence)")
        ids = tuple(int(t) for t in prompt)
        if any(not 0 <= t < self.config.vocab_size for t in ids):
            raise InvalidRequest(f"prompt token ids must lie in [0, {self.config.vocab_size})")
        if len(ids) >= self.max_context:
            raise InvalidRequest(f"a {len(ids)}-token prompt leaves no room in a "
                                 f"{self.max_context}-token context")
        grammar = options.pop(GRAMMAR_OPTION, None)
        if options.get("allowed_token_ids") is not None and (grammar is not None or options.get("min_tokens")):
            # Their masks could leave no token at all, and a row with nothing to sample would fail
            # every request in its frame.
            raise InvalidRequest("allowed_token_ids cannot be combined with a grammar or min_tokens")
        constraint = None
        if grammar is not None:
            if options.get("ignore_eos") or options.get("min_tokens"):
                # The grammar ends the output with EOS, which these would forbid.
                raise InvalidRequest("a response format (grammar) cannot be combined with ignore_eos or min_tokens")
            constraint = Constraint(self.prepare_grammars(), grammar)
        stopping = Stopping.of(self.tokenizer.eos_id, self.config.vocab_size,
                               **{k: options.pop(k) for k in STOPPING_OPTIONS if k in options})
        top, prompt_top = options.pop(LOGPROBS_OPTION, None), options.pop(PROMPT_LOGPROBS_OPTION, None)
        for name, k in ((LOGPROBS_OPTION, top), (PROMPT_LOGPROBS_OPTION, prompt_top)):
            if k is not None and (isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= MAX_LOGPROBS):
                raise InvalidRequest(f"{name} must be an integer in [0, {MAX_LOGPROBS}], got {k!r}")
        match = options.pop(RESTORE_OPTION, None)
        if match is not None and (self.checkpoints is None or not isinstance(match, Match)
                                  or not 0 < match.tokens < len(ids)):
            raise InvalidRequest(f"{RESTORE_OPTION} must be a CheckpointStore match inside the prompt")
        sampling = SamplingOptions.of(**options, vocab_size=self.config.vocab_size)
        self.requests[handle] = CoreRequest(handle, ids, sampling, sampling.generator(), stopping=stopping,
                                            logprobs=top, prompt_logprobs=prompt_top, constraint=constraint)
        if match is not None:
            self.pending_restores[handle] = match

    def detach(self, handle: RequestHandle) -> None:
        """Drop a request's state and free its slot (call once no queued frame can name it)."""
        r = self.requests.pop(handle, None)
        self.resumable.pop(handle, None)
        match = self.pending_restores.pop(handle, None)
        if match is not None:  # cancelled before its restore ran: drop the guard
            self.checkpoints.release(match.entry)
        if r is not None and r.slot is not None:
            self._free_slots.append(r.slot)

    # ---- execution -----------------------------------------------------------------------------
    def execute(self, plan: ScheduledPlan, fence: Fence) -> Execution:
        return self._on_torch(self._execute, plan, fence)

    def _execute(self, plan: ScheduledPlan, fence: Fence) -> Execution:
        if plan.shape.kind in STATE_KINDS:
            if self.checkpoints is None:
                raise PlanMismatch(f"{plan.shape.label()} needs a checkpoint store (checkpoint_memory)")
            timer = DeviceTimer(self.device)
            records = run_state_plan(self, plan)
            duration = timer.stop()
            return Execution(records, ExecutionTiming((duration,), None, None), duration)
        works = validate_plan(plan, self.requests, self._free_slots, self.catalog, self.max_context)
        if needs_packing(plan):
            return execute_packed(self, plan, works)
        graph = self.graphs[plan.shape]
        timer = DeviceTimer(self.device)
        kind = plan.shape.kind
        if kind is GraphKind.SPECULATIVE:
            # Proposal work belongs to the complete program's measured interval.
            drafts = [w.drafts() for w in works]
            rows = [RowWork(w.slot, (w.request.pending, *d), w.request.kv_len, True)
                    for w, d in zip(works, drafts)]
        elif kind.is_prefill:
            rows = [RowWork(w.slot, w.request.prompt[w.lane.prompt_start: w.lane.prompt_start
                                                     + w.lane.prompt_tokens],
                            w.lane.prompt_start, w.finishes_prompt) for w in works]
        else:
            rows = [RowWork(w.slot, (w.request.pending,), w.request.kv_len, True) for w in works]
        packing = graph.pack(rows)
        lps: dict = {}
        scores = None
        with torch.inference_mode():
            logits = graph.forward(self.model, self.cache)
            if kind is GraphKind.SPECULATIVE:
                outputs = verify_outputs(works, drafts, logits, lps)
            elif kind is GraphKind.SCORED_PREFILL:  # logits at every position [R, n, V]
                lengths = packing.query_lengths
                scores = prompt_scores(works, lambda b: logits[b, :lengths[b]])
                last = logits[torch.arange(len(lengths)), torch.tensor(lengths) - 1]
                outputs = sample_outputs(works, last, packing, lps)
            else:
                outputs = sample_outputs(works, logits[:, -1], packing, lps)
        duration = timer.stop()
        self.last_packing = packing
        offered = [len(d) for d in drafts] if kind is GraphKind.SPECULATIVE else [None] * len(works)
        records = tuple(self._commit(w, out, k) for w, out, k in zip(works, outputs, offered))
        return Execution(records, ExecutionTiming((duration,), None, None), duration,
                         logprobs=aligned_logprobs(records, lps), prompt_logprobs=scores, row_errors=row_errors(works))

    def _commit(self, w: LaneWork, tokens: list[int], offered: int | None) -> CompletionRecord:
        """Advance the request's state by what the execution produced; build its record."""
        r, lane = w.request, w.lane
        if w.new_slot:
            self._free_slots.remove(w.slot)
            r.slot = w.slot
        if lane.slot is not None:
            r.scheduler_slot = lane.slot
        end = r.stopping.first_terminal(tokens)
        if end is not None:
            tokens = tokens[: end + 1]  # nothing after EOS (or a stop token id) is output
        if lane.prompt_tokens:  # a prompt chunk (validated: only prefill and mixed prompt rows carry one)
            r.kv_len += lane.prompt_tokens
        else:
            r.kv_len += len(tokens)  # the old pending token and the accepted drafts
        r.generated.extend(tokens)
        if r.constraint is not None:
            r.constraint.consume(tokens)
        return CompletionRecord(lane.handle, lane.epoch, lane.prompt_tokens, tuple(tokens), end is not None,
                                offered)

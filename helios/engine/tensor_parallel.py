"""Tensor-parallel TorchCore over torch.distributed (gloo on the CPU, NCCL with CUDA).

Scheme (Megatron-style, sharding the weights of the one model in helios.engine.model.llama):
- attention is split by KV group: rank r holds a contiguous range of KV heads and the G = H/K
  query heads that read them (rows of attn_q/attn_k/attn_v, columns of attn_output), and its own
  KV cache holds only those heads. SmolLM2 has 3 KV heads: 3 ranks get one each; 2 ranks get an
  uneven 2 + 1 split (exact, only the load is 2:1). More ranks than KV heads is refused;
- the MLP is split by columns (gate/up rows of the hidden dimension) then rows (down columns);
- one all-reduce after each block part (attention output, MLP output): 2 per layer;
- embedding, norms and the LM head are replicated (every rank computes the same logits).

Rank contract (docs/scale-out.md):
- rank 0 lives in the caller's process and owns the scheduler; ranks 1..N-1 are spawned with
  torch.multiprocessing ("spawn"). Every attach/detach is queued on rank 0 and sent, in order,
  with the next frozen plan: one broadcast per execution.
- before running a plan every rank validates it against its own request state and all-gathers
  an identity (shape, fence, and per lane handle, epoch, slot, kv_len, outputs so far). Any
  error or disagreement skips the plan on every rank (no collective is left half-done) and
  rank 0 raises RankMismatch: only that plan's requests fail.
- every rank runs the same prepared graph and reports its own interval; the Execution's
  ExecutionTiming carries all of them, so the cost sample is their maximum
  (ExecutionTiming.device_interval_ns). Ranks also report their records' digest; rank 0 checks
  that they agree. Rank 0's records (and confidence, were there any) are the ones returned.
- a rank that fails *inside* the forward (between two all-reduces) cannot be recovered; the
  process-group timeout (`timeout_s`) bounds the wait and the core is then closed.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import logging
import os
import pickle
import signal
import socket
import time
from typing import Sequence

import torch
import torch.distributed as dist

from helios.engine.core import Execution
from helios.engine.model import LlamaModel, Tokenizer, load_weights
from helios.engine.torch_core import LoadedModel, TorchCore
from helios.engine.torch_state import PlanMismatch, validate_plan
from helios.errors import ConfigError
from helios.scheduler.plan import ExecutionTiming, Fence, RequestHandle, ScheduledPlan

__all__ = ["RankMismatch", "TensorParallelCore", "kv_head_ranges", "shard_weights"]

log = logging.getLogger(__name__)


class RankMismatch(PlanMismatch):
    """Ranks disagreed on a plan (identity, shape or an error on one rank); only that plan's
    requests fail."""


# ---- sharding -----------------------------------------------------------------------------------
def kv_head_ranges(n_kv_heads: int, world: int) -> list[range]:
    """Contiguous KV-head ranges per rank, as even as possible (3 heads on 2 ranks: 2 + 1)."""
    if not 1 <= world <= n_kv_heads:
        raise ConfigError("tensor_parallel", f"{world} ranks cannot split {n_kv_heads} KV heads "
                          f"(tensor parallelism needs 1..{n_kv_heads} ranks)")
    base, extra = divmod(n_kv_heads, world)
    out, start = [], 0
    for r in range(world):
        n = base + (r < extra)
        out.append(range(start, start + n))
        start += n
    return out


def mlp_range(hidden: int, world: int, rank: int) -> range:
    if hidden % world:
        raise ConfigError("tensor_parallel", f"MLP width {hidden} does not split over {world} ranks")
    n = hidden // world
    return range(rank * n, (rank + 1) * n)


def shard_weights(config, weights: dict[str, torch.Tensor], rank: int, world: int):
    """The rank's ModelConfig (local heads and MLP width) and weight dict (same names)."""
    kv = kv_head_ranges(config.n_kv_heads, world)[rank]
    G, D = config.n_heads // config.n_kv_heads, config.head_dim
    q = slice(kv.start * G * D, kv.stop * G * D)
    k = slice(kv.start * D, kv.stop * D)
    m = mlp_range(config.hidden_dim, world, rank)
    m = slice(m.start, m.stop)
    out = dict(weights)
    for i in range(config.n_layers):
        p = f"blk.{i}."
        out[p + "attn_q.weight"] = weights[p + "attn_q.weight"][q].contiguous()
        out[p + "attn_k.weight"] = weights[p + "attn_k.weight"][k].contiguous()
        out[p + "attn_v.weight"] = weights[p + "attn_v.weight"][k].contiguous()
        out[p + "attn_output.weight"] = weights[p + "attn_output.weight"][:, q].contiguous()
        out[p + "ffn_gate.weight"] = weights[p + "ffn_gate.weight"][m].contiguous()
        out[p + "ffn_up.weight"] = weights[p + "ffn_up.weight"][m].contiguous()
        out[p + "ffn_down.weight"] = weights[p + "ffn_down.weight"][:, m].contiguous()
    local = dataclasses.replace(config, n_heads=len(kv) * G, n_kv_heads=len(kv),
                                hidden_dim=m.stop - m.start)
    return local, out


class Collectives:
    """The all-reduce each block part ends with, timed (the share of time in collectives)."""

    def __init__(self):
        self.ns = 0
        self.calls = 0

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        start = time.perf_counter_ns()
        dist.all_reduce(t)
        self.ns += time.perf_counter_ns() - start
        self.calls += 1
        return t


def build_rank_core(rank: int, world: int, model_path, device, core_kwargs: dict):
    """Load the checkpoint, keep this rank's shard, and wrap it in an ordinary TorchCore."""
    device = torch.device(device)
    config, weights = load_weights(model_path)
    local, shard = shard_weights(config, weights, rank, world)
    del weights
    model = LlamaModel(local, shard, pack_weights=device.type == "cpu").to(device).eval()
    del shard
    coll = Collectives()
    if world > 1:
        for block in model.layers:
            block.attn_reduce = coll.all_reduce
            block.mlp_reduce = coll.all_reduce
    loaded = LoadedModel(local, model, Tokenizer.from_gguf(model_path), device)
    return TorchCore(loaded=loaded, device=device, **core_kwargs), coll


# ---- one step, on every rank ----------------------------------------------------------------------
def _apply_ops(core: TorchCore, ops) -> None:
    for op in ops:
        try:
            if op[0] == "attach":
                if op[1] not in core.requests:  # rank 0 attached it already
                    core.attach(op[1], op[2], **dict(op[3]))
            else:
                core.detach(op[1])
        except Exception:  # a disagreement shows up at the next plan's identity check
            log.exception("rank op %s failed", op[0])


def _records_digest(records) -> str:
    return hashlib.sha1(pickle.dumps([(r.handle, r.epoch, r.tokens, r.eos, r.offered) for r in records])).hexdigest()


def _run_step(core: TorchCore, coll: Collectives, rank: int, world: int, plan, fence, fault):
    """Preflight identity all-gather, the forward, then a result all-gather.
    Returns (execution or None, preflight list, results list)."""
    try:
        if fault == "preflight":
            raise RuntimeError(f"injected fault on rank {rank}")
        works = validate_plan(plan, core.requests, core._free_slots, core.catalog, core.max_context)
        ident = (plan.shape, fence, tuple((w.lane.handle, w.lane.epoch, w.slot, w.request.kv_len,
                                           len(w.request.generated)) for w in works))
        if fault == "identity":
            ident = (ident[0], ident[1], ident[2] + (("corrupted", rank),))
        pre = ("ok", ident)
    except Exception as exc:
        pre = ("error", f"{type(exc).__name__}: {exc}")
    pres: list = [None] * world
    dist.all_gather_object(pres, pre)
    if any(p[0] != "ok" for p in pres) or any(p[1] != pres[0][1] for p in pres):
        return None, pres, None
    coll.ns = coll.calls = 0
    execution = None
    try:
        extra = 0
        if isinstance(fault, tuple) and fault[0] == "skew":
            # Test hook: this rank reports `seconds` more than it measured. (A rank that really
            # sleeps makes the others wait in the next all-reduce, and their intervals grow too.)
            extra = int(fault[1] * 1e9)
        execution = core.execute(plan, fence)
        if fault == "execute":
            raise RuntimeError(f"injected fault on rank {rank} after the forward")
        post = ("ok", execution.duration_ns + extra, coll.ns, _records_digest(execution.records))
    except Exception as exc:
        post = ("error", f"{type(exc).__name__}: {exc}")
    posts: list = [None] * world
    dist.all_gather_object(posts, post)
    return execution, pres, posts


def _serve(core: TorchCore, coll: Collectives, rank: int, world: int) -> None:
    """Ranks 1..N-1: follow rank 0's broadcasts until it says stop (or goes away)."""
    while True:
        box = [None]
        dist.broadcast_object_list(box, src=0)
        msg = box[0]
        if msg[0] == "stop":
            return
        _apply_ops(core, msg[1])
        if msg[0] == "run":
            _, _, plan, fence, faults = msg
            _run_step(core, coll, rank, world, plan, fence, faults.get(rank))
        elif msg[0] == "time":
            _, _, shape, context = msg
            out: list = [None] * world
            dist.all_gather_object(out, core.time_graph(shape, context))


def _die_with_parent() -> None:
    try:  # Linux: SIGTERM this rank when rank 0's process dies, however it dies
        import ctypes
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:  # pragma: no cover - not Linux
        pass


def _worker_main(rank, world, init_method, backend, timeout_s, model_path, device, num_threads,
                 core_kwargs):
    _die_with_parent()
    if num_threads:
        torch.set_num_threads(num_threads)
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s))
    try:
        core, coll = build_rank_core(rank, world, model_path, device, core_kwargs)
        dist.barrier()
        _serve(core, coll, rank, world)
    except Exception as exc:  # rank 0 went away or a collective timed out
        log.warning("rank %d stops: %s", rank, exc)
    finally:
        try:
            dist.destroy_process_group()
        except Exception:
            pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- rank 0 ---------------------------------------------------------------------------------------
class TensorParallelCore:
    """A Core running one TorchCore shard per rank; this object is rank 0.

    `TensorParallelCore(2, max_context=..., ...)` spawns ranks 1..N-1 (torch.multiprocessing,
    "spawn"), joins them in a process group (gloo on the CPU, NCCL on CUDA) and shards the
    model. Other keyword arguments go to every rank's TorchCore. Call close() (or use it as a
    context manager) to stop the ranks; they also stop when this process dies.
    """

    def __init__(self, tensor_parallel: int = 2, model_path=None, *, device: str | torch.device = "cpu",
                 num_threads: int | None = None, timeout_s: float = 120.0, **core_kwargs):
        import torch.multiprocessing as mp

        self.world = int(tensor_parallel)
        if self.world < 1:
            raise ConfigError("tensor_parallel", "needs at least one rank")
        if dist.is_initialized():
            raise ConfigError("tensor_parallel", "a process group already exists in this process")
        device = torch.device(device)
        if device.type == "cuda":  # pragma: no cover - needs GPUs
            device = torch.device("cuda", 0)
        backend = "nccl" if device.type == "cuda" else "gloo"
        init_method = f"tcp://127.0.0.1:{_free_port()}"
        ctx = mp.get_context("spawn")
        self.procs = []
        for r in range(1, self.world):
            rank_device = f"cuda:{r}" if device.type == "cuda" else "cpu"
            p = ctx.Process(target=_worker_main, daemon=True, name=f"helios-rank{r}",
                            args=(r, self.world, init_method, backend, timeout_s, model_path,
                                  rank_device, num_threads, core_kwargs))
            p.start()
            self.procs.append(p)
        self._closed = False
        self._ready = False  # every rank built its shard and passed the barrier
        try:
            if num_threads:
                torch.set_num_threads(num_threads)
            dist.init_process_group(backend, init_method=init_method, rank=0, world_size=self.world,
                                    timeout=datetime.timedelta(seconds=timeout_s))
            self.core, self.collectives = build_rank_core(0, self.world, model_path, device, core_kwargs)
            dist.barrier()
            self._ready = True
        except BaseException:
            self.close()
            raise
        c = self.core
        self.catalog, self.tokenizer, self.device = c.catalog, c.tokenizer, c.device
        self.max_context, self.request_slots, self.capacities = c.max_context, c.request_slots, c.capacities
        self.speculation, self.captured = c.speculation, c.captured
        self.config = c.config  # rank 0's local shape (vocab_size, max_context are global)
        self._ops: list = []
        self.faults: dict[int, object] = {}  # test hook: rank -> fault for the next plan
        self.last_rank_intervals_ns: tuple[int, ...] = ()
        self.last_collective_ns: tuple[int, ...] = ()

    # -- Core --
    @property
    def requests(self):
        return self.core.requests

    def scheduler_config(self, **overrides):
        return self.core.scheduler_config(**overrides)

    def attach(self, handle: RequestHandle, prompt: Sequence[int], **options) -> None:
        self.core.attach(handle, prompt, **dict(options))  # validates; raises InvalidRequest
        self._ops.append(("attach", handle, tuple(int(t) for t in prompt), tuple(options.items())))

    def detach(self, handle: RequestHandle) -> None:
        self.core.detach(handle)
        self._ops.append(("detach", handle))

    def inject_fault(self, rank: int, fault) -> None:
        """Test hook: `fault` ("preflight", "identity", "execute" or ("skew", seconds)) applies
        to `rank` during the next plan only."""
        self.faults[rank] = fault

    def _send(self, msg) -> None:
        if self._closed:
            raise RankMismatch("the tensor-parallel ranks are closed")
        dist.broadcast_object_list([msg], src=0)

    def execute(self, plan: ScheduledPlan, fence: Fence) -> Execution:
        ops, self._ops = self._ops, []
        faults, self.faults = self.faults, {}
        self._send(("run", ops, plan, fence, faults))
        execution, pres, posts = _run_step(self.core, self.collectives, 0, self.world, plan, fence,
                                           faults.get(0))
        if posts is None:
            errors = [f"rank {r}: {p[1]}" for r, p in enumerate(pres) if p[0] != "ok"]
            if not errors:
                differ = [r for r, p in enumerate(pres) if p[1] != pres[0][1]]
                errors = [f"ranks {differ} disagree with rank 0 on the identities of "
                          f"{plan.shape.label()} at fence {fence}"]
            raise RankMismatch("; ".join(errors) + " (nothing executed on any rank)")
        errors = [f"rank {r}: {p[1]}" for r, p in enumerate(posts) if p[0] != "ok"]
        if not errors and any(p[3] != posts[0][3] for p in posts):
            errors = [f"ranks produced different outputs for {plan.shape.label()} at fence {fence}"]
        if errors:
            raise RankMismatch("; ".join(errors))
        intervals = tuple(int(p[1]) for p in posts)
        self.last_rank_intervals_ns = intervals
        self.last_collective_ns = tuple(int(p[2]) for p in posts)
        return Execution(execution.records, ExecutionTiming(intervals, None, None), max(intervals),
                         execution.confidence, execution.survival)

    def time_graph(self, shape, context: int = 0) -> int:
        ops, self._ops = self._ops, []
        self._send(("time", ops, shape, context))
        out: list = [None] * self.world
        dist.all_gather_object(out, self.core.time_graph(shape, context))
        return max(out)

    def warmup(self, repeats: int = 2) -> dict:
        return {shape: min(self.time_graph(shape) for _ in range(repeats)) for shape in self.catalog}

    # -- lifecycle --
    def close(self, timeout_s: float = 10.0) -> None:
        """Stop every rank and destroy the process group; idempotent."""
        if getattr(self, "_closed", True) and not self.procs:
            return
        if not self._closed and self._ready and dist.is_initialized():
            try:
                dist.broadcast_object_list([("stop",)], src=0)
            except Exception:
                pass
        self._closed = True
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:
                pass
        for p in self.procs:
            p.join(timeout_s)
            if p.is_alive():
                p.terminate()
                p.join(2)
            if p.is_alive():  # pragma: no cover
                p.kill()
                p.join(2)
        self.procs = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    @property
    def pids(self) -> list[int]:
        return [os.getpid()] + [p.pid for p in self.procs]

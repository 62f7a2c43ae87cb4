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
import os
import socket
from typing import Sequence

import torch
import torch.distributed as dist

from helios.engine.core import Execution
from helios.engine.rank_worker import run_step, worker_main
from helios.engine.sharding import build_rank_core, kv_head_ranges, shard_weights
from helios.engine.torch_state import PlanMismatch
from helios.errors import ConfigError
from helios.scheduler.plan import ExecutionTiming, Fence, RequestHandle, ScheduledPlan

__all__ = ["RankMismatch", "TensorParallelCore", "kv_head_ranges", "shard_weights"]


class RankMismatch(PlanMismatch):
    """Ranks disagreed on a plan (identity, shape or an error on one rank); only that plan's
    requests fail."""


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
            p = ctx.Process(target=worker_main, daemon=True, name=f"helios-rank{r}",
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
        execution, pres, posts = run_step(self.core, self.collectives, 0, self.world, plan, fence,
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
        # Rank 0's execution with the ranks' timing; every other field (log-probabilities too) as rank 0 gave it.
        return dataclasses.replace(execution, timing=ExecutionTiming(intervals, None, None),
                                   duration_ns=max(intervals))

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

"""Tensor-parallel sharding of the one Llama model: which KV heads and MLP columns each rank holds,
and the timed all-reduce each block part ends with (the scheme: helios/engine/tensor_parallel.py)."""

from __future__ import annotations

import dataclasses
import time

import torch
import torch.distributed as dist

from helios.engine.cpu_threads import TorchThread
from helios.engine.model import LlamaModel, load_tokenizer, load_weights
from helios.engine.torch_core import LoadedModel, TorchCore
from helios.errors import ConfigError


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
        for name, rows in (("attn_q.bias", q), ("attn_k.bias", k), ("attn_v.bias", k)):  # Qwen2
            if p + name in weights:
                out[p + name] = weights[p + name][rows].contiguous()
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
    coll = Collectives()
    # On the CPU the shard is built on the thread that will run it: a thread that starts an OpenMP
    # region gets a pool of its own, and two pools in one process throttle each other (cpu_threads).
    thread = TorchThread(core_kwargs.get("num_threads")) if device.type == "cpu" else None
    build = lambda: _load_shard(rank, world, model_path, device, coll)  # noqa: E731
    loaded = build() if thread is None else thread.call(build)
    return TorchCore(loaded=loaded, device=device, torch_thread=thread, **core_kwargs), coll


def _load_shard(rank: int, world: int, model_path, device, coll: Collectives) -> LoadedModel:
    config, weights = load_weights(model_path)
    local, shard = shard_weights(config, weights, rank, world)
    del weights
    model = LlamaModel(local, shard, pack_weights=device.type == "cpu").to(device).eval()
    del shard
    if world > 1:
        for block in model.layers:
            block.attn_reduce = coll.all_reduce
            block.mlp_reduce = coll.all_reduce
    return LoadedModel(local, model, load_tokenizer(model_path), device)

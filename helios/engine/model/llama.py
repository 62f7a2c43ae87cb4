"""Llama forward pass in float32 with a slot-addressed KV cache.

Batches are fixed-shape ``[B, L]`` grids. Row ``b`` belongs to request slot
``slots[b]`` and carries tokens at absolute positions ``positions[b]``. Rows
that carry no request point at the scratch slot (``cache.scratch_slot``), so
their writes never touch real state.

Padding invariant: a real row whose tail is padding must give the padded
tokens positions strictly greater than all its real positions (and below the
cache's ``max_context``). Their K/V land in not-yet-valid cache positions of that
slot; real queries never see them (they attend only to positions <= their
own) and the slot's next real tokens overwrite them before any query can.
"""

from __future__ import annotations

import math
import mmap

import torch
import torch.nn.functional as F
from torch import nn

from helios.engine.model.weights import WeightFormat, frozen, linear
from helios.engine.model.loader import ModelConfig

# Key windows are rounded up to this many positions so attention shapes take
# few distinct values (static-shape friendly) at the cost of <= 63 masked keys.
KV_WINDOW_QUANTUM = 64


class KVCache:
    """Per-slot K/V storage: ``k``/``v`` are ``[n_layers, num_slots + 1,
    n_kv_heads, max_context, head_dim]``; the last slot is scratch space.

    Which positions of a slot are valid is tracked by the caller.
    """

    def __init__(self, config: ModelConfig, num_slots: int, max_context: int | None = None):
        self.num_slots = num_slots
        self.max_context = max_context or config.max_context
        if self.max_context > config.max_context:  # RoPE tables stop there
            raise ValueError(f"max_context {self.max_context} > model's {config.max_context}")
        shape = (config.n_layers, num_slots + 1, config.n_kv_heads, self.max_context,
                 config.head_dim)
        # float32 like the model; 2 * 30 * 3 * 64 * 4 B = 46 KB per cached
        # token and slot for SmolLM2 (377 MB per slot at the full 8k context).
        self.k = _zeros(shape)
        self.v = _zeros(shape)
        self._rows: tuple[torch.Tensor, torch.Tensor] | None = None  # rows()'s reused destinations

    def rows(self, layer: int, slots: torch.Tensor, window: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer `layer`'s keys and values of rows `slots` up to `window`: two [B, K, window, D]
        tensors, valid until the next call (layers attend one at a time).

        On the CPU they are copied into buffers this cache keeps, grown to the largest gather so far.
        A fresh tensor per layer and step is 10-100 MB, and depending on the allocator's state it is
        mapped and faulted in page by page: a B=16 decode at 1,000 tokens of context, the model
        called directly on a worker thread (2-vCPU VM), took 313-337 ms with fresh tensors against
        123 ms with these (docs/server.md, "CPU threads"). index_select copies whole [K, window, D]
        blocks; advanced indexing went element by element. One row (a single stream's decode) gets
        a view of its slot's block instead: no copy at all.
        """
        cache_k, cache_v = self.k[layer], self.v[layer]
        if cache_k.device.type != "cpu":  # CUDA's caching allocator reuses its blocks already
            return (cache_k[:, :, :window].index_select(0, slots),
                    cache_v[:, :, :window].index_select(0, slots))
        if slots.numel() == 1:  # one row: its slot's block as it is (a view, no copy)
            slot = int(slots[0])
            return cache_k[slot:slot + 1, :, :window], cache_v[slot:slot + 1, :, :window]
        _, K, _, D = cache_k.shape
        n = slots.numel() * K * window * D
        if self._rows is None or self._rows[0].numel() < n:
            self._rows = (torch.empty(n, dtype=cache_k.dtype), torch.empty(n, dtype=cache_v.dtype))
        shape = (slots.numel(), K, window, D)
        keys = torch.index_select(cache_k[:, :, :window], 0, slots, out=self._rows[0][:n].view(shape))
        values = torch.index_select(cache_v[:, :, :window], 0, slots, out=self._rows[1][:n].view(shape))
        return keys, values

    @property
    def scratch_slot(self) -> int:
        """Slot index that padding rows write into (== num_slots)."""
        return self.num_slots

    def reset(self, slot: int, zero: bool = False) -> None:
        """Forget a slot. Stale entries are harmless (lengths live with the
        caller and get overwritten before being read), so zeroing is optional."""
        if zero:
            self.k[:, slot].zero_()
            self.v[:, slot].zero_()


def _zeros(shape: tuple[int, ...]) -> torch.Tensor:
    """A float32 zero tensor on the default device; on the CPU, backed by an anonymous mapping.

    Why: the OS zero-fills an anonymous mapping page by page on first touch, so a cache sized for
    every slot's whole context commits memory only for the positions actually written.
    torch.zeros writes every byte up front: 6.9 GB RSS and 30 s for 32 slots x 4k contexts.
    Zeros matter: masked keys still meet their values in SDPA (weight 0 * value), so a cache
    must never hold NaN garbage.
    """
    if torch.get_default_device().type != "cpu":
        return torch.zeros(shape)
    buffer = mmap.mmap(-1, math.prod(shape) * 4)
    return torch.frombuffer(buffer, dtype=torch.float32).view(shape)  # keeps `buffer` alive


def rope_tables(head_dim: int, base: float,
                max_context: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables ``[max_context, head_dim]`` for rotate-half RoPE."""
    # theta_i = base^(-2i/d) for i < d/2; angle(p, i) = p * theta_i. Computed in
    # float64 so large positions keep their precision, stored in float32.
    inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.outer(torch.arange(max_context, dtype=torch.float64), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)  # both halves share frequencies
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # HF layout: dimension i pairs with i + d/2, so rotating the pair (a, b) by
    # angle t is (a cos t - b sin t, b cos t + a sin t) = x*cos + rot(x)*sin
    # with rot(x) = [-x2, x1]. (GGUF pairs adjacent dims; the loader undid that.)
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # x / sqrt(mean(x^2) + eps) * weight, over the model dimension.
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


class Block(nn.Module):
    """One transformer layer: pre-norm GQA attention + pre-norm SwiGLU MLP."""

    def __init__(self, config: ModelConfig, w: dict[str, torch.Tensor], i: int, pack: bool,
                 fmt: WeightFormat = WeightFormat.FLOAT32, quantized: dict | None = None):
        super().__init__()
        p = f"blk.{i}."
        self.config = config

        def fused(*names: str) -> nn.Module:
            # Projections that share an input run as one matmul: [sum of outs, dim] is faster.
            weight = torch.cat([w[p + n] for n in names]) if len(names) > 1 else w[p + names[0]]
            groups = [quantized.get(p + n) for n in names] if quantized else None
            return linear(weight, pack, fmt, groups)

        self.attn_norm = frozen(w[p + "attn_norm.weight"])
        self.wqkv = fused("attn_q.weight", "attn_k.weight", "attn_v.weight")
        self.wo = fused("attn_output.weight")
        # Qwen2's q/k/v biases (Llama has none), added after the fused projection.
        bias = [w.get(p + f"attn_{x}.bias") for x in "qkv"]
        self.bqkv = frozen(torch.cat(bias)) if bias[0] is not None else None
        self.ffn_norm = frozen(w[p + "ffn_norm.weight"])
        self.w13 = fused("ffn_gate.weight", "ffn_up.weight")  # gate and up: [2 * hidden, dim]
        self.w2 = fused("ffn_down.weight")
        # Tensor parallelism (helios.engine.tensor_parallel) sets these to an all-reduce of the
        # partial sums a rank's shard of wo / w2 produces; None on one rank (no reduction).
        self.attn_reduce = None
        self.mlp_reduce = None

    def forward(self, x, cos, sin, mask, slots, positions, cache, layer, window):
        c = self.config
        B, L, _ = x.shape
        H, K, D = c.n_heads, c.n_kv_heads, c.head_dim
        G = H // K  # query heads per KV head

        qkv = self.wqkv(rms_norm(x, self.attn_norm, c.norm_eps))
        if self.bqkv is not None:
            qkv = qkv + self.bqkv
        qk, v = qkv.split([(H + K) * D, K * D], dim=-1)
        # One rotation for the query and key heads together (the same elementwise ops as two, in
        # half the calls: a decode step is ~30 small ops per layer, each costing its dispatch).
        q, k = apply_rope(qk.view(B, L, H + K, D).transpose(1, 2), cos, sin).split([H, K], dim=1)
        v = v.view(B, L, K, D)  # q [B, H, L, D], k [B, K, L, D]

        # Write this step's K/V: cache_k[slot, :, pos] <- [K, D] for each
        # (row, token). Advanced indices on dims 0 and 2 put [B, L] first.
        cache.k[layer][slots[:, None], :, positions] = k.transpose(1, 2)
        cache.v[layer][slots[:, None], :, positions] = v
        keys, values = cache.rows(layer, slots, window)  # [B, K, W, D] each

        # GQA without repeating K/V: query head h uses KV head h // G, so fold
        # the G query heads of a KV head into the query axis: [B, K, G*L, D].
        q = q.reshape(B, K, G * L, D)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        out = out.reshape(B, H, L, D).transpose(1, 2).reshape(B, L, H * D)  # CUDA SDPA may return strided output
        o = self.wo(out)
        x = x + (o if self.attn_reduce is None else self.attn_reduce(o))

        # SwiGLU: down(silu(gate(h)) * up(h)).
        gate, up = self.w13(rms_norm(x, self.ffn_norm, c.norm_eps)).chunk(2, dim=-1)
        m = self.w2(F.silu(gate) * up)
        return x + (m if self.mlp_reduce is None else self.mlp_reduce(m))


class LlamaModel(nn.Module):
    """Llama-family decoder built from :func:`load_weights` output (fp32; ``weight_format``
    picks how linears are stored, helios.engine.model.weights; GGUF multiplies ``quantized``, the
    file's own weights from :func:`helios.engine.model.loader.load_quantized`)."""

    def __init__(self, config: ModelConfig, weights: dict[str, torch.Tensor],
                 pack_weights: bool = True, weight_format: WeightFormat = WeightFormat.FLOAT32,
                 quantized: dict | None = None):
        super().__init__()
        if config.n_heads % config.n_kv_heads:
            raise ValueError("n_heads must be a multiple of n_kv_heads")
        self.config = config
        self.tok_embeddings = frozen(weights["token_embd.weight"])
        self.layers = nn.ModuleList(Block(config, weights, i, pack_weights, weight_format, quantized)
                                    for i in range(config.n_layers))
        self.norm = frozen(weights["output_norm.weight"])
        # Tied models project with the embedding matrix. Packing keeps a second
        # (packed) copy of it: +113 MB for SmolLM2 for a ~2x faster projection.
        head = "token_embd.weight" if config.tie_embeddings else "output.weight"
        self.output = linear(weights[head], pack_weights, weight_format,
                             [quantized.get(head)] if quantized else None, head=True)
        cos, sin = rope_tables(config.head_dim, config.rope_base, config.max_context)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                cache: KVCache, kv_window: int | None = None,
                logits_at: torch.Tensor | None = None) -> torch.Tensor:
        """Run ``tokens [B, L]`` at ``positions [B, L]`` for rows in ``slots [B]``.

        Writes each row's K/V into its slot, attends causally by position
        (keys at positions <= the query's), returns logits ``[B, L, V]``.
        ``kv_window``: keys attended per row (default: max position + 1
        rounded up to 64); it must exceed every position. ``logits_at [B]``:
        only compute logits at that index of each row (returns ``[B, 1, V]``).
        """
        B, L = tokens.shape
        # Reading positions.max() synchronizes with the host, which CUDA graph capture forbids:
        # a caller that passes kv_window (prepared graphs) takes responsibility for covering it.
        top = None
        if kv_window is None:
            top = int(positions.max()) + 1  # keys needed: positions 0 .. top - 1
            kv_window = min(-(-top // KV_WINDOW_QUANTUM) * KV_WINDOW_QUANTUM, cache.max_context)
        elif not positions.is_cuda:
            top = int(positions.max()) + 1
        if top is not None and not top <= kv_window <= cache.max_context:
            raise ValueError(f"kv_window={kv_window} must cover positions < {top} and fit "
                             f"max_context={cache.max_context}")
        G = self.config.n_heads // self.config.n_kv_heads

        x = F.embedding(tokens, self.tok_embeddings)
        cos = self.rope_cos[positions][:, None]  # [B, 1, L, D], broadcast over heads
        sin = self.rope_sin[positions][:, None]
        # mask[b, q, k] = k <= positions[b, q]; True means "may attend". Repeat
        # it for the G query heads folded into the query axis: [B, 1, G*L, W].
        key_pos = torch.arange(kv_window, device=tokens.device)
        mask = key_pos[None, None, :] <= positions[:, :, None]
        mask = mask[:, None].expand(B, G, L, kv_window).reshape(B, 1, G * L, kv_window)

        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, mask, slots, positions, cache, i, kv_window)
        if logits_at is not None:
            x = x[torch.arange(B, device=x.device), logits_at][:, None]  # [B, 1, dim]
        return self.output(rms_norm(x, self.norm, self.config.norm_eps))


def generate_greedy(model: LlamaModel, tokenizer, prompt_ids: list[int], max_new_tokens: int,
                    cache: KVCache, slot: int = 0) -> list[int]:
    """Greedy-decode up to ``max_new_tokens`` ids after ``prompt_ids`` in ``slot``.

    One-shot prefill, then one token per step; stops after emitting EOS (which
    is included). Meant for tests and examples, not for serving.
    """
    slots = torch.tensor([slot])
    tokens = torch.tensor([prompt_ids])
    positions = torch.arange(len(prompt_ids))[None]
    out: list[int] = []
    for _ in range(max_new_tokens):
        last = torch.tensor([tokens.shape[1] - 1])
        logits = model(tokens, positions, slots, cache, logits_at=last)
        next_id = int(logits[0, -1].argmax())
        out.append(next_id)
        if next_id == tokenizer.eos_id:
            break
        positions = positions[:, -1:] + 1
        tokens = torch.tensor([[next_id]])
    return out

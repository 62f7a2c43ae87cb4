"""One packed forward over rows of different query lengths (the spec's mixed execution contract).

Where the rectangular forward (llama.LlamaModel.forward) runs a [B, L] grid, this one runs a single
[T] token sequence: row b's queries sit at packed offsets offsets[b] .. offsets[b + 1] - 1, where the
offsets are prefix sums of the rows' query lengths (never derived from slot ids). The token-parallel
layers (QKV, output and MLP projections, the LM head) run once over all T positions; attention runs
per row over that row's own slot, so a prompt chunk and decode rows share one weight pass without
padding each other to a common length. Short rows (decode and speculative rows: at most as many queries
as the graph samples per row) attend in one batched call, as the rectangular forward does.

State: each real token writes its K/V at (its row's slot, its position). Positions past the last row
(unused capacity) belong to no row; they write only the cache's scratch slot, so they mutate no state.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from helios.engine.model.llama import KV_WINDOW_QUANTUM, Block, KVCache, LlamaModel, apply_rope, rms_norm


def token_slots(query_lengths: torch.Tensor, slots: torch.Tensor, total: int, scratch_slot: int) -> torch.Tensor:
    """The slot each of `total` packed positions writes: its row's slot, or the scratch slot for
    positions past the last row. Derived on the device from the one query-length tensor."""
    ends = torch.cumsum(query_lengths, 0)  # offsets[1:]: row b ends at ends[b]
    # Position t belongs to the first row whose end exceeds t; past every end it gets index B.
    row = torch.searchsorted(ends, torch.arange(total, device=ends.device), right=True)
    scratch = torch.full((1,), scratch_slot, dtype=slots.dtype, device=slots.device)
    return torch.cat([slots, scratch])[row]


@dataclass(frozen=True)
class ShortRows:
    """Rows of at most L queries attended together in one [R, K, G * L, D] call."""

    gather: torch.Tensor  # [R, L] packed index of query i of row r (clamped to the row's last one)
    slots: torch.Tensor  # [R]
    window: int
    mask: torch.Tensor  # [R, 1, G * L, window]
    src: torch.Tensor  # flat r * L + i of every real query
    dst: torch.Tensor  # ... and its packed position

    @classmethod
    def of(cls, rows: list[tuple[int, int, int, int]], G: int, max_context: int, device) -> "ShortRows":
        """From (offset, length, slot, first position) per row."""
        L = max(n for _, n, _, _ in rows)
        i = torch.arange(L, device=device)
        offsets, lengths, slots, starts = (torch.tensor(col, device=device) for col in zip(*rows))
        gather = offsets[:, None] + torch.minimum(i[None], lengths[:, None] - 1)
        top = max(start + L for _, _, _, start in rows)
        window = min(-(-top // KV_WINDOW_QUANTUM) * KV_WINDOW_QUANTUM, max_context)
        # mask[r, q, k] = k <= starts[r] + q; padded queries past a row's length are discarded.
        query_pos = starts[:, None] + i[None]
        mask = torch.arange(window, device=device)[None, None, :] <= query_pos[:, :, None]  # [R, L, window]
        mask = mask[:, None].expand(len(rows), G, L, window).reshape(len(rows), 1, G * L, window)
        real = i[None] < lengths[:, None]  # [R, L]
        src = real.flatten().nonzero().flatten()
        return cls(gather, slots, window, mask, src, gather.flatten()[src])

    def attend(self, q: torch.Tensor, cache: KVCache, layer: int, out: torch.Tensor, G: int) -> None:
        H, _, D = q.shape
        R, L = self.gather.shape
        K = H // G
        # GQA as in Block.forward: [R, H, L, D] -> [R, K, G * L, D].
        qs = q[:, self.gather].permute(1, 0, 2, 3).reshape(R, K, G * L, D)
        keys, values = cache.rows(layer, self.slots, self.window)  # [R, K, window, D], as Block.forward
        o = F.scaled_dot_product_attention(qs, keys, values, attn_mask=self.mask)
        o = o.reshape(R, H, L, D).permute(1, 0, 2, 3).reshape(H, R * L, D)
        out[:, self.dst] = o[:, self.src]


def packed_block(layer: Block, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor,
                 slots_per_token: torch.Tensor, rows: list[tuple[int, int, int, int, torch.Tensor]],
                 short: ShortRows | None, cache: KVCache, index: int) -> torch.Tensor:
    """Layer `index` over packed tokens x [1, T, dim]. `rows`: (offset, length, slot, key window,
    attention mask [1, G * length, window]) of each row attended alone; `short`: the batched ones."""
    c = layer.config
    T = x.shape[1]
    H, K, D = c.n_heads, c.n_kv_heads, c.head_dim
    G = H // K

    cache_k, cache_v = cache.k[index], cache.v[index]
    q, k, v = layer.wqkv(rms_norm(x, layer.attn_norm, c.norm_eps)).split([H * D, K * D, K * D], dim=-1)
    q = apply_rope(q.view(1, T, H, D).transpose(1, 2), cos, sin)[0]  # [H, T, D]
    k = apply_rope(k.view(1, T, K, D).transpose(1, 2), cos, sin)[0]  # [K, T, D]
    v = v.view(T, K, D)
    # cache[slot(t), :, position(t)] <- [K, D] for every packed position t (padding: scratch slot).
    cache_k[slots_per_token, :, positions] = k.transpose(0, 1)
    cache_v[slots_per_token, :, positions] = v

    out = torch.zeros(H, T, D, dtype=x.dtype, device=x.device)  # padding positions attend to nothing
    for off, n, slot, window, mask in rows:
        keys = cache_k[slot, :, :window]  # [K, window, D]: this row's own slot only
        values = cache_v[slot, :, :window]
        # GQA as in Block.forward: the G query heads of a KV head fold into the query axis.
        qs = q[:, off:off + n].reshape(K, G * n, D)
        out[:, off:off + n] = F.scaled_dot_product_attention(qs, keys, values, attn_mask=mask).reshape(H, n, D)
    if short is not None:
        short.attend(q, cache, index, out, G)
    o = layer.wo(out.transpose(0, 1).reshape(1, T, H * D))
    x = x + (o if layer.attn_reduce is None else layer.attn_reduce(o))

    # SwiGLU: down(silu(gate(h)) * up(h)), once over every packed position.
    gate, up = layer.w13(rms_norm(x, layer.ffn_norm, c.norm_eps)).chunk(2, dim=-1)
    m = layer.w2(F.silu(gate) * up)
    return x + (m if layer.mlp_reduce is None else layer.mlp_reduce(m))


def _causal_mask(start: int, n: int, window: int, G: int, device) -> torch.Tensor:
    # Causal by position: the query at position start + i sees keys at positions <= start + i;
    # repeated for the G query heads folded into the query axis: [1, G * n, window].
    key_pos = torch.arange(window, device=device)
    mask = key_pos[None, :] <= torch.arange(start, start + n, device=device)[:, None]  # [n, window]
    return mask[None].expand(G, n, window).reshape(1, G * n, window)


@torch.inference_mode()
def packed_forward(model: LlamaModel, tokens: torch.Tensor, positions: torch.Tensor, query_lengths: torch.Tensor,
                   slots: torch.Tensor, cache: KVCache, logits_at: torch.Tensor,
                   every_position: bool = False) -> torch.Tensor:
    """Run packed `tokens [T]` at `positions [T]`; row b has query_lengths[b] tokens (0: inactive) in
    slot slots[b]. Returns logits [B, S, V] at the packed indices `logits_at [B, S]`, or with
    `every_position` logits [T, V] at every packed position (a scored prefill's prompt scores).

    Row b's positions must be consecutive (start .. start + n - 1) and below cache.max_context.
    """
    T = tokens.shape[0]
    G = model.config.n_heads // model.config.n_kv_heads
    lengths = query_lengths.tolist()
    pos_host, slot_host = positions.tolist(), slots.tolist()
    rows, short, offset = [], [], 0
    width = logits_at.shape[1]  # rows this short (decode, speculative) attend in one batched call
    for b, n in enumerate(lengths):
        if n:
            start = pos_host[offset]
            if pos_host[offset:offset + n] != list(range(start, start + n)):
                raise ValueError(f"row {b}: positions must be consecutive from {start}")
            if start + n > cache.max_context:
                raise ValueError(f"row {b}: positions up to {start + n - 1} exceed max_context {cache.max_context}")
            if n <= width:
                short.append((offset, n, slot_host[b], start))
            else:
                # Keys needed: positions 0 .. start + n - 1, rounded up so windows take few values.
                window = min(-(-(start + n) // KV_WINDOW_QUANTUM) * KV_WINDOW_QUANTUM, cache.max_context)
                rows.append((offset, n, slot_host[b], window, _causal_mask(start, n, window, G, tokens.device)))
        offset += n
    grouped = ShortRows.of(short, G, cache.max_context, tokens.device) if short else None
    if offset > T:
        raise ValueError(f"{offset} query tokens exceed the packed extent {T}")
    per_token = token_slots(query_lengths, slots, T, cache.scratch_slot)

    x = F.embedding(tokens, model.tok_embeddings)[None]  # [1, T, dim]
    cos = model.rope_cos[positions][None, None]  # [1, 1, T, D]
    sin = model.rope_sin[positions][None, None]
    for i, layer in enumerate(model.layers):
        x = packed_block(layer, x, cos, sin, positions, per_token, rows, grouped, cache, i)
    x = x[0] if every_position else x[0, logits_at]  # [B, S, dim]: only the positions that sample
    return model.output(rms_norm(x, model.norm, model.config.norm_eps))

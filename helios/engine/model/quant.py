"""Weight-only quantized linears that multiply the GGUF's own quantized weights (the default format
for a quantized GGUF: `--weights gguf`).

The file's weights decode to groups of 32 that share a scale and an offset
(helios.engine.model.ggml_blocks: w = codes * scale + offset). torch's CPU kernel for grouped int4
weights, `_weight_int4pack_mm_for_cpu`, computes with groups of the same size

    y[m, n] = sum_k x[m, k] * ((q[n, k] - 8) * s[k // 32, n] + z[k // 32, n]),   0 <= q < 16,

so a 4-bit format maps onto it exactly: q = codes, s = scale, z = offset + 8 scale. Wider codes
(Q5_*, Q8_0) split into 4-bit planes, codes = sum_p 16**p * c_p, and

    w = sum_p (c_p * 16**p scale) + offset,

one int4 matmul per plane with s_p = 16**p scale and z_p = 8 s_p (+ offset on one plane), summed.
Every plane is exact: with float32 activations the module equals dequantize-then-float32-matmul up
to float rounding (tests/model/test_quant_linear.py). That path is slow (unvectorized); the served
one passes bfloat16 activations, scales and zeros, which the kernel vectorizes, and returns
bfloat16. bench/quant_kernels.py measured it against oneDNN's float32 and bfloat16 linears,
torch's per-channel int8 kernel and dequantize-on-the-fly; docs/server.md has the figures.
"""

from __future__ import annotations

import functools

import numpy as np
import torch
from torch import nn

from helios.engine.model.ggml_blocks import GROUP, AffineGroups


@functools.cache
def int4pack_available() -> bool:
    """Whether this torch build has the CPU grouped-int4 kernel (and it computes what we assume)."""
    try:
        codes = torch.arange(16 * 64, dtype=torch.int32).remainder(16).reshape(16, 64)
        packed = torch._convert_weight_to_int4pack_for_cpu(codes, 1)
        sz = torch.stack([torch.rand(2, 16) + 0.5, torch.randn(2, 16)], dim=-1)  # [groups, n, (scale, zero)]
        x = torch.randn(3, 64)
        y = torch._weight_int4pack_mm_for_cpu(x, packed, GROUP, sz)
        w = (codes.float() - 8) * sz.repeat_interleave(GROUP, 0)[..., 0].T + sz.repeat_interleave(GROUP, 0)[..., 1].T
        return bool(torch.allclose(y, x @ w.T, atol=1e-4))
    except (AttributeError, RuntimeError, TypeError):
        return False


def _plane(codes: np.ndarray, scale: np.ndarray, offset: np.ndarray | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed int4 weights and [groups, n, 2] scales/zeros of one 4-bit plane."""
    packed = torch._convert_weight_to_int4pack_for_cpu(torch.from_numpy(codes.astype(np.int32)), 1)
    zero = 8 * scale if offset is None else 8 * scale + offset
    sz = torch.from_numpy(np.stack([scale.T, zero.T], axis=-1).astype(np.float32)).contiguous()
    return packed, sz


def quant_activations() -> torch.dtype:
    """Activation dtype of the served int4 kernel: bfloat16, its vectorized path (float32 measured
    4-60x slower than oneDNN's float32 linear, float16 slower still; bench/quant_kernels.py)."""
    return torch.bfloat16


# Calls with more rows than this run the dense copy (see QuantLinear).
SMALL_ROWS = 4


class QuantLinear(nn.Module):
    """``y = x @ W.T`` with W ``[out, in]`` given as affine groups of 32 (GGUF's quantized blocks),
    stored as one to two packed 4-bit planes; x is float32 and so is y.

    The int4 kernel reads a quarter of bfloat16's bytes but multiplies row by row: measured
    (bench/quant_kernels.py, SmolLM2's gate/up projections of 30 layers in turn, one thread) it
    beat oneDNN's bfloat16 linear 1.6x at 1 row, 1.1x at 4, and lost at 8 (0.7x) and 16 (0.6x).
    With `dense` (a module for the dequantized weights, e.g. helios.engine.model.weights.Linear),
    calls of more than `small_rows` rows run that instead.
    """

    def __init__(self, groups: AffineGroups, activations: torch.dtype = torch.float32,
                 dense: nn.Module | None = None, small_rows: int = SMALL_ROWS):
        super().__init__()
        self.dense = dense
        self.small_rows = small_rows
        if not int4pack_available():
            raise RuntimeError("quantized GGUF weights need torch's CPU int4 kernel (_weight_int4pack_mm_for_cpu)")
        self.out_features, self.in_features = groups.codes.shape
        self.bits = groups.bits
        self.activations = activations
        n = -(-groups.bits // 4)
        scales = [groups.scale * 16.0 ** p for p in range(n)]
        # The offset joins the plane whose zero it cancels best: any plane is exact in float32,
        # but a zero kept small keeps its rounding small in bfloat16 (Q8_0: offset -128 d cancels
        # the top plane's 8 * 16 d exactly, where plane 0 would carry -120 d).
        home = min(range(n), key=lambda p: float(np.abs(8 * scales[p] + groups.offset).sum()))
        planes = [_plane((groups.codes >> (4 * p)) & 0x0F, scales[p], groups.offset if p == home else None)
                  for p in range(n)]
        for i, (packed, sz) in enumerate(planes):
            self.register_buffer(f"packed{i}", packed, persistent=False)
            self.register_buffer(f"sz{i}", sz.to(activations), persistent=False)
        self.planes = len(planes)

    @staticmethod
    def fits(out_features: int, in_features: int) -> bool:
        """Whether the kernel takes this shape (it packs rows in blocks of 16; groups of 32)."""
        return out_features % 16 == 0 and in_features % GROUP == 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, self.in_features)
        if self.dense is not None and x2.shape[0] > self.small_rows:
            return self.dense(x)
        x2 = x2.to(self.activations)
        y = torch._weight_int4pack_mm_for_cpu(x2, self.packed0, GROUP, self.sz0).float()
        for i in range(1, self.planes):  # planes summed in float32
            y += torch._weight_int4pack_mm_for_cpu(x2, getattr(self, f"packed{i}"), GROUP, getattr(self, f"sz{i}"))
        return y.view(*x.shape[:-1], self.out_features)


def stack(groups: list[AffineGroups]) -> AffineGroups:
    """Row-wise concatenation (the fused QKV and gate/up projections); bits are the widest."""
    return AffineGroups(np.concatenate([g.codes for g in groups]), np.concatenate([g.scale for g in groups]),
                        np.concatenate([g.offset for g in groups]), max(g.bits for g in groups))

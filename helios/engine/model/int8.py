"""Weight-only-int8 storage with dynamically quantized activations for CPU linears (opt-in).

`--weights int8`: each weight row is stored as int8 with its own scale (symmetric, per output
channel), and fbgemm's dynamic linear quantizes each input row on the fly. Per decode step it
reads a quarter of the float32 weight bytes, which is what bounds decoding on a CPU: measured on
this project's 2-core AMD EPYC (one thread, under load) 3.4-4.4x faster at 1 row for the MLP and
output projections, 1.3-3.5x at 16 rows, and no gain at 256 (prefill is compute-bound). Whole
graphs on a 2-vCPU Xeon: bench/graph_profile.py.

It changes the numerics more than bfloat16 does: greedy tokens often differ from the float32
model's from the first one (docs/server.md has the measured agreement), so float32 stays the default. The quantized-tensor
API used here is deprecated in torch; the packed weights are built once at load.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn


def int8_available() -> bool:
    return "fbgemm" in torch.backends.quantized.supported_engines


class Int8Linear(nn.Module):
    """``y ~= x @ W.T`` with W quantized to int8 per output row (scale = max |row| / 127)."""

    def __init__(self, weight: torch.Tensor):
        super().__init__()
        if not int8_available():
            raise RuntimeError("int8 weights need torch's fbgemm quantized engine (x86 CPUs)")
        torch.backends.quantized.engine = "fbgemm"
        self.out_features, self.in_features = weight.shape
        w = weight.detach().float().contiguous()
        scales = (w.abs().amax(dim=1) / 127).clamp_min(1e-12).double()
        with warnings.catch_warnings():  # the deprecation notice of quantized tensors, once per layer
            warnings.simplefilter("ignore", UserWarning)
            q = torch.quantize_per_channel(w, scales, torch.zeros_like(scales, dtype=torch.long), 0, torch.qint8)
        self._packed = torch.ops.quantized.linear_prepack(q, None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # reduce_range: 7-bit activations, which fbgemm needs on CPUs without VNNI to avoid
        # overflowing its 16-bit accumulation.
        y = torch.ops.quantized.linear_dynamic(x.reshape(-1, self.in_features), self._packed, True)
        return y.view(*x.shape[:-1], self.out_features)

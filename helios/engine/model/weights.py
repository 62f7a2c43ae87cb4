"""How the model's linear weights are stored and multiplied: the format a server picks with
`--weights`, and one module per format.

GGUF (`flare run`'s default on the CPU) multiplies the file's own quantized weights
(helios.engine.model.quant): what llama.cpp serves from the same file, at a quarter to an eighth
of float32's bytes per token. FLOAT32 (the library's default, `--weights fp32`) keeps the
dequantized GGUF weights exactly, so its greedy tokens are the reference ones. BF16 and INT8
trade those tokens for speed on the CPU: BF16 rounds weights and activations to bfloat16 and
accumulates in float32 (oneDNN; fast where the CPU multiplies bfloat16 natively, AMX or
AVX512-BF16), INT8 stores int8 weights and quantizes activations on the fly
(fbgemm; helios.engine.model.int8).
"""

from __future__ import annotations

import enum
import functools

import torch
import torch.nn.functional as F
from torch import nn

from helios.engine.model.ggml_blocks import AffineGroups
from helios.engine.model.head import RescoredHead
from helios.engine.model.int8 import Int8Linear
from helios.engine.model.quant import QuantLinear, quant_activations, stack


class WeightFormat(enum.Enum):
    """How the model's linear weights are stored and multiplied on the CPU."""

    GGUF = "gguf"  # the file's quantized weights as they are (grouped int4 kernel); other tensors as FLOAT32
    FLOAT32 = "fp32"  # the dequantized GGUF weights exactly (oneDNN-packed): the reference tokens
    BF16 = "bf16"  # bfloat16 weights and activations, float32 accumulation (oneDNN): faster, other tokens
    INT8 = "int8"  # per-channel int8 weights, dynamic int8 activations (fbgemm): faster, other tokens


def frozen(t: torch.Tensor) -> nn.Parameter:
    return nn.Parameter(t.contiguous(), requires_grad=False)


def _packed_linear_works(dtype: torch.dtype, atol: float) -> bool:
    # These are private ops (used by inductor's CPU backend), so probe them once against F.linear
    # instead of trusting their presence.
    try:
        w, x = torch.randn(8, 4), torch.randn(2, 4)
        packed = torch.ops.mkldnn._reorder_linear_weight(w.to(dtype), None)
        y = torch.ops.mkldnn._linear_pointwise(x.to(dtype), packed, None, "none", [], "").float()
        return bool(torch.allclose(y, F.linear(x, w), atol=atol))
    except (AttributeError, RuntimeError, TypeError):
        return False


@functools.cache
def onednn_linear_available() -> bool:
    """Whether oneDNN's packed fp32 linear works in this torch build."""
    return _packed_linear_works(torch.float32, 1e-5)


@functools.cache
def bf16_available() -> bool:
    """Whether this CPU and torch build multiply bfloat16 in oneDNN (natively: AMX or AVX512-BF16)."""
    try:
        native = torch.cpu._is_amx_tile_supported() or torch.cpu._is_avx512_bf16_supported()
    except AttributeError:
        return False
    return native and _packed_linear_works(torch.bfloat16, 0.1)


class Linear(nn.Module):
    """``y = x @ W.T`` with W ``[out, in]``, stored in oneDNN's packed layout.

    Why: on CPU, MKL's fp32 gemm for ``x @ W.T`` reaches only ~8 GB/s of
    weight bandwidth at the small row counts of decoding (1-16 rows), while
    oneDNN's pre-packed weights reach ~20 GB/s; measured 2-4x faster decode
    steps and still faster on 256-row prefill. In our checks it also gave
    each row the same bits whatever the batch size (not a documented
    guarantee). Falls back to F.linear when oneDNN is unavailable.

    With ``dtype=torch.bfloat16``, W and x are rounded to bfloat16 and the products summed in
    float32; the output is float32, so the residual stream, norms and attention stay float32.
    Measured on the 2-vCPU Xeon with AMX (bench/graph_profile.py, two threads): a B=1 decode 27.3
    against 40.1 ms in float32 (half the weight bytes), B=16 50.2 against 79.2, a 256-token
    prefill 148 against 272 ms (AMX's bfloat16 tiles).
    """

    def __init__(self, weight: torch.Tensor, pack: bool = True, dtype: torch.dtype = torch.float32):
        super().__init__()
        if dtype is torch.bfloat16 and not bf16_available():
            raise RuntimeError("bf16 weights need a CPU that multiplies bfloat16 natively (AMX or AVX512-BF16) "
                               "and torch's oneDNN")
        self.out_features, self.in_features = weight.shape
        self.dtype = dtype
        self.packed = dtype is torch.bfloat16 or (pack and onednn_linear_available())
        if self.packed:
            # Opaque oneDNN tensor; the dense copy can be freed by the caller.
            self.register_buffer("weight", torch.ops.mkldnn._reorder_linear_weight(
                weight.to(dtype).contiguous(), None), persistent=False)
        else:
            self.weight = frozen(weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.packed:
            return F.linear(x, self.weight)
        if self.dtype is torch.float32:
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, None, "none", [], "")
        return torch.ops.mkldnn._linear_pointwise(x.to(self.dtype), self.weight, None, "none", [], "").float()


def linear(weight: torch.Tensor, pack: bool, fmt: WeightFormat,
           groups: list[AffineGroups | None] | None = None, head: bool = False) -> nn.Module:
    """The linear module of format `fmt` for `weight` [out, in] (`pack`: oneDNN's layout for fp32).

    With GGUF, `groups` are the file's quantized parts of `weight` (row blocks, in order); when every
    part has them and the kernel takes the shape, the file's weights run in QuantLinear, with a
    dense copy (bfloat16 where the CPU multiplies it natively, else float32) for calls of many rows.
    The LM head (`head`) scores every token in bfloat16 where the CPU has it and rescores the
    candidates in float32 (helios.engine.model.head: greedy's pick is float32's), else runs float32.
    Tensors the file does not quantize stay float32."""
    if fmt is WeightFormat.GGUF:
        if head and bf16_available():
            return RescoredHead(weight, Linear(weight, pack, torch.bfloat16))
        if not head and groups and all(g is not None for g in groups) and QuantLinear.fits(*weight.shape):
            dense = Linear(weight, pack, torch.bfloat16 if bf16_available() else torch.float32)
            return QuantLinear(stack(groups), quant_activations(), dense)
        fmt = WeightFormat.FLOAT32
    if fmt is WeightFormat.INT8:
        return Int8Linear(weight)
    return Linear(weight, pack, torch.bfloat16 if fmt is WeightFormat.BF16 else torch.float32)

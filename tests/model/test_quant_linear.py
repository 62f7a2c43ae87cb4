"""The GGUF's quantized weights as served (`--weights gguf`): block decoding equals gguf-py's (i.e.
ggml's) dequantizers for every served format, and the quantized linear equals
dequantize-then-matmul."""

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, quants

from helios.engine.model import ggml_blocks
from helios.engine.model.quant import QuantLinear, int4pack_available, stack

# Byte offsets of each block's float16 fields (d, and m / dmin where the format has one).
FP16_FIELDS = {"Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,), "Q4_K": (0, 2),
               "Q5_K": (0, 2)}


def random_blocks(name: str, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """Random raw bytes of a `name` tensor with finite float16 scales (every code pattern occurs)."""
    per_block, nbytes, _, _ = ggml_blocks.FORMATS[name]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(rows * cols // per_block, nbytes), dtype=np.uint8)
    for at in FP16_FIELDS[name]:
        raw[:, at:at + 2] = rng.normal(0, 0.02, size=(len(raw), 1)).astype(np.float16).view(np.uint8)
    return raw


def test_every_format_has_its_fp16_fields_listed():
    assert set(FP16_FIELDS) == set(ggml_blocks.FORMATS)


@pytest.mark.parametrize("name", sorted(ggml_blocks.FORMATS))
def test_decoded_groups_equal_ggmls_dequantization(name):
    rows, cols = 16, 512
    raw = random_blocks(name, rows, cols)
    groups = ggml_blocks.decode(name, raw, rows, cols)
    assert groups.codes.max() < 2 ** groups.bits
    reference = quants.dequantize(raw, GGMLQuantizationType[name]).reshape(rows, cols)
    np.testing.assert_allclose(groups.dequantize(), reference, rtol=1e-6, atol=1e-7)


def test_a_row_of_partial_blocks_is_refused():
    with pytest.raises(ValueError, match="whole blocks"):
        ggml_blocks.decode("Q4_K", np.zeros((1, 144), np.uint8), 1, 128)


needs_kernel = pytest.mark.skipif(not int4pack_available(), reason="no CPU int4 kernel in this torch")


@needs_kernel
@pytest.mark.parametrize("name", sorted(ggml_blocks.FORMATS))
@pytest.mark.parametrize("batch", [1, 16])
def test_quant_linear_in_float32_equals_dequantize_then_matmul(name, batch):
    """The mapping onto the kernel (planes, scales, zeros) is exact: with float32 activations the
    kernel multiplies the file's weights to float32 rounding."""
    rows, cols = 48, 512
    groups = ggml_blocks.decode(name, random_blocks(name, rows, cols, seed=1), rows, cols)
    layer = QuantLinear(groups, activations=torch.float32)
    assert layer.planes == (1 if groups.bits == 4 else 2)
    x = torch.randn(batch, cols, generator=torch.Generator().manual_seed(2))
    exact = x.double() @ torch.from_numpy(groups.dequantize()).double().T
    torch.testing.assert_close(layer(x).double(), exact, rtol=0, atol=1e-5 * exact.abs().max().item())


def bf16_weights(groups) -> torch.Tensor:
    """What the bfloat16 kernel multiplies: each plane's scale and zero rounded to bfloat16."""
    w = 0
    n = -(-groups.bits // 4)
    offset = torch.from_numpy(groups.offset)
    home = min(range(n), key=lambda p: float((8 * torch.from_numpy(groups.scale) * 16.0 ** p + offset).abs().sum()))
    for p in range(n):
        s = torch.from_numpy(groups.scale * 16.0 ** p)
        z = 8 * s + (offset if p == home else 0)
        s, z = (v.bfloat16().double().repeat_interleave(ggml_blocks.GROUP, 1) for v in (s, z))
        c = torch.from_numpy((groups.codes >> (4 * p)) & 0x0F).double()
        w = w + (c - 8) * s + z
    return w


@needs_kernel
@pytest.mark.parametrize("name", sorted(ggml_blocks.FORMATS))
@pytest.mark.parametrize("batch", [1, 16])
def test_served_quant_linear_is_the_files_weights_with_bfloat16_activations(name, batch):
    """The served path (bfloat16 activations, the kernel's fast one): bf16(x) times the file's
    weights with bfloat16 scales and zeros, its output rounded to bfloat16; those weights are the
    file's to bfloat16's precision."""
    rows, cols = 48, 512
    groups = ggml_blocks.decode(name, random_blocks(name, rows, cols, seed=3), rows, cols)
    layer = QuantLinear(groups, activations=torch.bfloat16)
    x = torch.randn(batch, cols, generator=torch.Generator().manual_seed(4))
    w = bf16_weights(groups)
    exact_w = torch.from_numpy(groups.dequantize()).double()
    assert (w - exact_w).abs().max() <= 2 ** -7 * exact_w.abs().max()
    expected = x.bfloat16().double() @ w.T
    y = layer(x)
    assert y.dtype == torch.float32 and y.shape == (batch, rows)
    # Each plane's output is rounded to bfloat16 before the planes are summed.
    torch.testing.assert_close(y.double(), expected, rtol=2 ** -8, atol=2 ** -7 * expected.abs().max().item())
    # ... and far from a wrong mapping: the same codes with Q4_0's zero instead of the file's offset.
    assert (expected - x.double() @ exact_w.T).abs().max() < 0.05 * expected.abs().max()

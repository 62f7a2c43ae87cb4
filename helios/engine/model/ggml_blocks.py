"""GGUF's quantized block formats, decoded to one form: groups of 32 weights along a row that share
a scale and an offset.

Every format served quantized (helios.engine.model.quant) reads as

    w[n, k] = codes[n, k] * scale[n, k // 32] + offset[n, k // 32],   0 <= codes < 2**bits

which is what llama.cpp's dequantizers compute (ggml-quants.c; gguf.quants mirrors them):

- Q4_0: w = d * (q - 8)            codes q (4 bits), scale d, offset -8 d
- Q4_1: w = d * q + m              codes q (4 bits), scale d, offset m
- Q5_0: w = d * (q - 16)           codes q (5 bits: 4 low + 1 high), offset -16 d
- Q5_1: w = d * q + m              codes q (5 bits)
- Q8_0: w = d * q, q signed int8   codes q + 128 (8 bits), offset -128 d
- Q4_K, Q5_K: super-blocks of 256 with eight 32-weight sub-blocks, each with 6-bit scale sc and
  min mn: w = (d sc) q - (dmin mn), so scale d sc and offset -dmin mn per sub-block.

Formats whose scales cover 16 weights (Q2_K, Q3_K, Q6_K) or that use lookup tables (IQ*) have no
such form; the loader dequantizes them to float32 (exact, unquantized speed).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

GROUP = 32  # weights per scale/offset group in every format below


@dataclass(frozen=True)
class AffineGroups:
    """w = codes * scale + offset, per group of GROUP weights along a row (see the module doc)."""

    codes: np.ndarray  # uint8 [rows, cols], each < 2**bits
    scale: np.ndarray  # float32 [rows, cols // GROUP]
    offset: np.ndarray  # float32 [rows, cols // GROUP]
    bits: int

    def take_rows(self, rows: np.ndarray) -> "AffineGroups":
        """The groups of rows `rows`, in that order (groups run along rows, so rows move whole)."""
        return AffineGroups(self.codes[rows], self.scale[rows], self.offset[rows], self.bits)

    def dequantize(self) -> np.ndarray:
        """The float32 weights [rows, cols] the groups stand for."""
        rows, cols = self.codes.shape
        g = self.codes.reshape(rows, cols // GROUP, GROUP).astype(np.float32)
        return (g * self.scale[..., None] + self.offset[..., None]).reshape(rows, cols)


def _f16(b: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(b).view(np.float16).astype(np.float32)[..., 0]


def _nibbles(qs: np.ndarray) -> np.ndarray:
    # ggml packs a 32-weight group in 16 bytes: weight i in the low nibble of byte i, weight
    # i + 16 in the high nibble.
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _high_bits(qh: np.ndarray, n: int) -> np.ndarray:
    # Bit i of the little-endian bit string qh (bytes) is the fifth bit of weight i.
    return np.unpackbits(qh, axis=-1, bitorder="little")[..., :n]


def _q4_0(b):
    d = _f16(b[:, 0:2])
    return _nibbles(b[:, 2:]), d, -8 * d


def _q4_1(b):
    d, m = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    return _nibbles(b[:, 4:]), d, m


def _q5_0(b):
    d = _f16(b[:, 0:2])
    return _nibbles(b[:, 6:]) | (_high_bits(b[:, 2:6], 32) << 4), d, -16 * d


def _q5_1(b):
    d, m = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    return _nibbles(b[:, 8:]) | (_high_bits(b[:, 4:8], 32) << 4), d, m


def _q8_0(b):
    d = _f16(b[:, 0:2])
    return (b[:, 2:].view(np.int8).astype(np.int16) + 128).astype(np.uint8), d, -128 * d


def _k_scales(b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-sub-block scale d * sc and offset -dmin * mn of Q4_K/Q5_K super-blocks [n, 8]."""
    d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    s = b[:, 4:16].reshape(-1, 3, 4)
    # 12 bytes hold eight 6-bit scales and eight 6-bit mins: sub-blocks 0-3 in the low 6 bits of
    # bytes 0-3 (scales) and 4-7 (mins); sub-blocks 4-7 in the nibbles of bytes 8-11 plus the
    # top 2 bits of bytes 0-3 / 4-7 (ggml's get_scale_min_k4).
    lo, mid, hi = s[:, 0], s[:, 1], s[:, 2]
    sc = np.concatenate([lo & 0x3F, (hi & 0x0F) | ((lo >> 2) & 0x30)], axis=-1).astype(np.float32)
    mn = np.concatenate([mid & 0x3F, (hi >> 4) | ((mid >> 2) & 0x30)], axis=-1).astype(np.float32)
    return d[:, None] * sc, -(dmin[:, None] * mn)


def _k_nibbles(qs: np.ndarray) -> np.ndarray:
    # 128 bytes for 256 weights: each 32-byte chunk holds sub-block 2j in its low nibbles and
    # sub-block 2j + 1 in its high nibbles.
    qs = qs.reshape(-1, 4, 1, 32)
    return np.concatenate([qs & 0x0F, qs >> 4], axis=2).reshape(-1, 256)


def _q4_k(b):
    scale, offset = _k_scales(b)
    return _k_nibbles(b[:, 16:]), scale, offset


def _q5_k(b):
    scale, offset = _k_scales(b)
    # qh: 32 bytes; bit j of byte i is the fifth bit of weight 32 j + i.
    high = np.unpackbits(b[:, 16:48], axis=-1, bitorder="little").reshape(-1, 32, 8).transpose(0, 2, 1)
    return _k_nibbles(b[:, 48:]) | (high.reshape(-1, 256) << 4), scale, offset


# name -> (weights per block, bytes per block, code bits, decoder of a [blocks, bytes] uint8 array)
FORMATS = {
    "Q4_0": (32, 18, 4, _q4_0),
    "Q4_1": (32, 20, 4, _q4_1),
    "Q5_0": (32, 22, 5, _q5_0),
    "Q5_1": (32, 24, 5, _q5_1),
    "Q8_0": (32, 34, 8, _q8_0),
    "Q4_K": (256, 144, 4, _q4_k),
    "Q5_K": (256, 176, 5, _q5_k),
}


def decode(name: str, raw: np.ndarray, rows: int, cols: int) -> AffineGroups:
    """Decode the raw bytes of a `name`-format tensor of `rows` x `cols` weights (row-major, as
    GGUF stores them) into affine groups. KeyError for a format not in FORMATS."""
    per_block, nbytes, bits, fn = FORMATS[name]
    if cols % per_block:
        raise ValueError(f"{name}: a row of {cols} weights is not whole blocks of {per_block}")
    blocks = np.ascontiguousarray(raw, dtype=np.uint8).reshape(rows * cols // per_block, nbytes)
    codes, scale, offset = fn(blocks)
    return AffineGroups(codes.reshape(rows, cols).astype(np.uint8),
                        np.asarray(scale, np.float32).reshape(rows, cols // GROUP),
                        np.asarray(offset, np.float32).reshape(rows, cols // GROUP), bits)

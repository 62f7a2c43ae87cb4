"""Candidate CPU kernels for the GGUF's quantized weights, on the embedded SmolLM2's own tensors.

Per weight (the fused gate/up projection and the down projection of layer 0, Q4_1; the tied output
projection, Q8_0) and batch (rows of activations: 1 = one decoding stream, 16 = sixteen), times:
- fp32: the dequantized weights in oneDNN's packed float32 linear (today's `--weights fp32`);
- bf16: oneDNN's bfloat16 linear (`--weights bf16`; rounds weights, not the file's numerics);
- int4 f32 / int4 bf16: torch's grouped int4 kernel (`_weight_int4pack_mm_for_cpu`), one plane for
  4-bit codes, two summed planes for 8-bit ones (helios.engine.model.quant), float32 or bfloat16
  activations;
- int8 per-group: `_weight_int8pack_mm` (per-channel scales only) once per 32-column group, summed:
  the exact way to use it for Q8_0's per-block scales;
- int8 per-channel: one `_weight_int8pack_mm` call with one scale per row: NOT the file's weights
  (the per-block scales folded away), only to show what the kernel alone costs;
- dequant: codes -> float32 weights on every call, then a float32 matmul.
Plus each candidate's largest error against dequantize-then-float64-matmul, relative to the output's
scale. Rounds interleave the candidates and the minimum per candidate is kept, so a machine shared
with other jobs slows all of them alike and spikes drop out.

Run: .venv/bin/python bench/quant_kernels.py [--threads 1] [--rounds 7]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from helios.engine.model.ggml_blocks import GROUP, decode
from helios.engine.model.loader import open_gguf
from helios.engine.model.quant import QuantLinear, stack
from helios.engine.model.weights import Linear, bf16_available


def tensor_groups(reader, name):
    t = next(t for t in reader.tensors if t.name == name)
    cols, rows = (int(d) for d in t.shape)
    return decode(t.tensor_type.name, t.data, rows, cols)


def int8_per_group(groups):
    q = torch.from_numpy((groups.codes.astype(np.int16) - 128).astype(np.int8))
    scale = torch.from_numpy(groups.scale)
    parts = [(q[:, g * GROUP:(g + 1) * GROUP].contiguous(), scale[:, g].contiguous())
             for g in range(q.shape[1] // GROUP)]

    def run(x):
        y = None
        for g, (qg, sg) in enumerate(parts):
            part = torch._weight_int8pack_mm(x[:, g * GROUP:(g + 1) * GROUP].contiguous(), qg, sg)
            y = part if y is None else y.add_(part)
        return y
    return run


def int8_per_channel(groups):
    q = torch.from_numpy((groups.codes.astype(np.int16) - 128).astype(np.int8))
    scale = torch.from_numpy(groups.scale.mean(axis=1).astype(np.float32))
    return lambda x: torch._weight_int8pack_mm(x, q, scale)


def dequant_on_the_fly(groups):
    codes = torch.from_numpy(groups.codes)
    scale, offset = torch.from_numpy(groups.scale), torch.from_numpy(groups.offset)
    rows, cols = codes.shape

    def run(x):
        w = codes.view(rows, cols // GROUP, GROUP).float() * scale[..., None] + offset[..., None]
        return x @ w.view(rows, cols).T
    return run


# Candidates too slow to matter are timed on one layer's weights only (cache-warm, which flatters them).
SLOW = ("int4 f32", "dequant")


def candidates(layers):
    """name -> one callable per layer's weights (the slow ones: the first layer only)."""
    out = {}
    for i, groups in enumerate(layers):
        dense = torch.from_numpy(groups.dequantize())
        fns = {"fp32": Linear(dense)}
        if bf16_available():
            fns["bf16"] = Linear(dense, dtype=torch.bfloat16)
        fns["int4 bf16"] = QuantLinear(groups, activations=torch.bfloat16)
        fns["int4 f16"] = QuantLinear(groups, activations=torch.float16)
        if groups.bits == 8:
            fns["int8 per-group"] = int8_per_group(groups)
            fns["int8 per-channel*"] = int8_per_channel(groups)
        if i == 0:
            fns["int4 f32"] = QuantLinear(groups)
            fns["dequant"] = dequant_on_the_fly(groups)
        for k, fn in fns.items():
            out.setdefault(k, []).append(fn)
    return out


def time_pass(fns, x):
    """Seconds per call, calling each layer's weights once in turn (weights stream from memory as
    in a decode step, instead of staying in cache)."""
    start = time.perf_counter()
    for fn in fns:
        fn(x)
    return (time.perf_counter() - start) / len(fns)


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--layers", type=int, default=30, help="layers whose weights are cycled (SmolLM2 has 30)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    reader = open_gguf()
    n = args.layers
    weights = {
        "w13 Q4_1 [3072x576]": [stack([tensor_groups(reader, f"blk.{i}.ffn_gate.weight"),
                                       tensor_groups(reader, f"blk.{i}.ffn_up.weight")]) for i in range(n)],
        "w2 Q4_1 [576x1536]": [tensor_groups(reader, f"blk.{i}.ffn_down.weight") for i in range(n)],
        "output Q8_0 [49152x576]": [tensor_groups(reader, "token_embd.weight")],
    }
    print(f"threads {args.threads}, rounds {args.rounds}, {n} layers' weights in turn; ms per call (min over "
          f"rounds), ratio = fp32 / it, err = max |y - y_exact| / max |y_exact| on the first layer", flush=True)
    for label, layers in weights.items():
        fns = candidates(layers)
        dense = torch.from_numpy(layers[0].dequantize()).double()
        for m in (1, 16):
            x = torch.randn(m, dense.shape[1])
            exact = x.double() @ dense.T
            best = {k: float("inf") for k in fns}
            for _ in range(args.rounds):
                for k, layer_fns in fns.items():
                    layer_fns[0](x)  # warm the code path
                    best[k] = min(best[k], time_pass(layer_fns, x))
            cells = []
            for k, layer_fns in fns.items():
                err = float((layer_fns[0](x).double() - exact).abs().max() / exact.abs().max())
                cells.append(f"{k} {best[k] * 1e3:.3f} ms ({best['fp32'] / best[k]:.2f}x, err {err:.0e})")
            print(f"{label} B={m}: " + "; ".join(cells), flush=True)
    print("* int8 per-channel folds each row's block scales into one: not the file's weights, cost only")


if __name__ == "__main__":
    main()

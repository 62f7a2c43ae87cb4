"""Read a Llama-family GGUF file into a config and float32 torch tensors.

Everything that depends on the checkpoint format lives here: the rest of
``helios.engine.model`` only sees a :class:`ModelConfig` and a dict of plain
``[out_features, in_features]`` weights keyed by the GGUF tensor names.
"""

from __future__ import annotations

import dataclasses
import functools
import pathlib

import numpy as np
import torch

from helios.engine.model.ggml_blocks import FORMATS as BLOCK_FORMATS, decode as decode_blocks
# The bundled model's location, in a torch-free module (`flare run` checks the model's header
# before torch loads).
from helios.engine.model_files import DIST_NAME, GGUF_FILE, INSTALL_HINT, default_model_path  # noqa: F401


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Shape and numerics of a Llama-family model, read from GGUF metadata."""

    n_layers: int
    dim: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    hidden_dim: int
    vocab_size: int
    rope_base: float
    max_context: int
    norm_eps: float
    tie_embeddings: bool
    eos_id: int
    bos_id: int | None = None  # token to prepend to prompts; None = none


def open_gguf(path=None):
    """A ``gguf.GGUFReader`` on ``path`` (default: :func:`default_model_path`)."""
    path = pathlib.Path(path) if path is not None else default_model_path()
    if not path.is_file():
        raise FileNotFoundError(f"GGUF model file {path} does not exist")
    stat = path.stat()
    return _cached_reader(str(path.resolve()), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=1)
def _cached_reader(path: str, mtime_ns: int, size: int):
    # Parsing the header (49k vocabulary strings) takes ~3 s; the tokenizer
    # and the weights both need it, so keep the last reader around. It holds
    # a read-only memmap of the file (address space and reclaimable page
    # cache) plus the parsed header.
    import gguf  # imported lazily: only loading needs it

    return gguf.GGUFReader(path)


def read_metadata(reader) -> dict:
    """All GGUF key/value fields as Python values (lists for arrays)."""
    return {name: field.contents() for name, field in reader.fields.items()}


def config_from_metadata(meta: dict, tensor_names: set[str]) -> ModelConfig:
    """Build a ModelConfig from GGUF metadata; errors clearly on non-Llama."""
    arch = meta.get("general.architecture")
    if arch != "llama":
        raise ValueError(
            f"unsupported GGUF architecture {arch!r}: only 'llama' is implemented"
        )

    def key(name, default=None):
        value = meta.get(f"llama.{name}", default)
        if value is None:
            raise ValueError(f"GGUF metadata lacks required key 'llama.{name}'")
        return value

    dim = int(key("embedding_length"))
    n_heads = int(key("attention.head_count"))
    head_dim = int(key("attention.key_length", dim // n_heads))
    # Partial rotary and RoPE scaling (linear/yarn/llama3) would change the
    # numerics silently; refuse rather than produce a subtly wrong model.
    if int(key("rope.dimension_count", head_dim)) != head_dim:
        raise NotImplementedError("partial rotary embeddings are not supported")
    scaling = meta.get("llama.rope.scaling.type", "none")
    if scaling not in ("none", None):
        raise NotImplementedError(f"RoPE scaling {scaling!r} is not supported")

    vocab = meta.get("llama.vocab_size")
    if vocab is None:  # older converters only store the token list
        vocab = len(meta["tokenizer.ggml.tokens"])
    bos = meta.get("tokenizer.ggml.bos_token_id")
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", True))
    return ModelConfig(
        n_layers=int(key("block_count")),
        dim=dim,
        n_heads=n_heads,
        n_kv_heads=int(key("attention.head_count_kv", n_heads)),
        head_dim=head_dim,
        hidden_dim=int(key("feed_forward_length")),
        vocab_size=int(vocab),
        rope_base=float(key("rope.freq_base", 10000.0)),
        max_context=int(key("context_length")),
        norm_eps=float(key("attention.layer_norm_rms_epsilon")),
        tie_embeddings="output.weight" not in tensor_names,
        eos_id=int(meta["tokenizer.ggml.eos_token_id"]),
        bos_id=int(bos) if (bos is not None and add_bos) else None,
    )


def load_config(path=None) -> ModelConfig:
    """Read only the config of a GGUF (default: the bundled SmolLM2)."""
    reader = open_gguf(path)
    return config_from_metadata(read_metadata(reader), {t.name for t in reader.tensors})


def unpermute_rope(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Undo llama.cpp's Q/K row permutation (GGUF -> Hugging Face layout).

    convert_hf_to_gguf.py reorders each head's output rows from HF's
    "rotate half" layout [x0..x{d/2-1}, y0..y{d/2-1}] to interleaved pairs
    [x0, y0, x1, y1, ...] for its adjacent-pair RoPE kernel. It does
    ``w.reshape(n_heads, 2, d/2, in).swapaxes(1, 2)``; the inverse is the same
    reshape with the two middle axes the other way round.
    """
    out_features, in_features = w.shape
    half = out_features // n_heads // 2
    return (
        w.reshape(n_heads, half, 2, in_features)
        .transpose(1, 2)
        .reshape(out_features, in_features)
        .contiguous()
    )


def rope_rows(out_features: int, n_heads: int) -> np.ndarray:
    """Row order that :func:`unpermute_rope` applies: row i of the result is row rows[i] of the
    GGUF tensor (for tensors kept in another form than float32 rows, e.g. quantized groups)."""
    index = torch.arange(out_features, dtype=torch.float64)[:, None]
    return unpermute_rope(index, n_heads)[:, 0].long().numpy()


def _to_torch(tensor) -> torch.Tensor:
    from gguf import quants

    array = quants.dequantize(tensor.data, tensor.tensor_type)
    array = np.ascontiguousarray(array, dtype=np.float32)
    # GGUF lists dims innermost-first (``tensor.shape`` is [in, out]); the numpy
    # view/dequantized array is already in row-major torch order [out, in].
    expected = tuple(int(d) for d in reversed(tensor.shape))
    array = array.reshape(expected)
    if not array.flags.writeable:  # F32 tensors come back as read-only memmaps
        array = array.copy()
    return torch.from_numpy(array)


def load_weights(path=None) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """Load a Llama GGUF as (config, float32 tensors keyed by GGUF name).

    Weights keep their GGUF names (``token_embd.weight``,
    ``blk.{i}.attn_q.weight``, ``output_norm.weight`` ...) but are torch-shaped
    ``[out, in]`` and Q/K rows are returned in Hugging Face rotate-half order.
    ``path`` defaults to :func:`default_model_path`.
    """
    reader = open_gguf(path)
    meta = read_metadata(reader)
    config = config_from_metadata(meta, {t.name for t in reader.tensors})
    weights = {}
    for tensor in reader.tensors:
        w = _to_torch(tensor)
        if tensor.name.endswith("attn_q.weight"):
            w = unpermute_rope(w, config.n_heads)
        elif tensor.name.endswith("attn_k.weight"):
            w = unpermute_rope(w, config.n_kv_heads)
        weights[tensor.name] = w
    return config, weights


def load_quantized(path=None) -> dict:
    """The quantized linear weights of a Llama GGUF as they are in the file, keyed by GGUF name:
    ``helios.engine.model.ggml_blocks.AffineGroups`` (``[out, in]``, Q/K rows in Hugging Face
    order as :func:`load_weights` returns them) for every 2-D tensor in a format listed in
    ``ggml_blocks.FORMATS``. Tensors in other formats (F32, F16, Q6_K, ...) are left out."""
    reader = open_gguf(path)
    meta = read_metadata(reader)
    config = config_from_metadata(meta, {t.name for t in reader.tensors})
    out = {}
    for tensor in reader.tensors:
        name = tensor.tensor_type.name
        if name not in BLOCK_FORMATS or len(tensor.shape) != 2:
            continue
        cols, rows = (int(d) for d in tensor.shape)  # GGUF lists dims innermost-first
        groups = decode_blocks(name, tensor.data, rows, cols)
        heads = {"attn_q.weight": config.n_heads, "attn_k.weight": config.n_kv_heads}
        for suffix, n in heads.items():
            if tensor.name.endswith(suffix):
                groups = groups.take_rows(rope_rows(rows, n))
        out[tensor.name] = groups
    return out

"""A model file's header, read in well under a second and without torch: the architecture, the
shape that sizing needs, and the parameter count of every tensor.

`flare run` checks `--model` with it before anything heavy loads: a wrong architecture or a model
too large for this machine is refused with the real cause at once, not after the weights loaded
(or failed to). GGUF layout (github.com/ggml-org/ggml, docs/gguf.md): magic "GGUF", version,
tensor count, key/value count, the key/values, then one info record per tensor.
"""

from __future__ import annotations

import json
import mmap
import pathlib
import struct
from dataclasses import dataclass

from helios.errors import ConfigError

SERVED_ARCHITECTURES = ("llama",)  # GGUF architectures the engine runs (helios.engine.model.loader)
HF_ARCHITECTURES = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2"}

# GGUF value types -> struct format (8: string and 9: array are read separately).
_SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


@dataclass(frozen=True, slots=True)
class ModelShape:
    """What sizing and the checks need from a model file."""

    path: pathlib.Path
    architecture: str | None
    n_layers: int
    n_kv_heads: int
    head_dim: int
    max_context: int
    params: int  # every tensor's elements
    embedding_params: int  # the token embedding's (kept float32 by every weight format)
    tied_embeddings: bool  # the output projection is a copy of the embedding (one more matrix in memory)
    file_bytes: int


class _Reader:
    def __init__(self, buf):
        self.buf, self.pos = buf, 0

    def scalar(self, fmt: str):
        (value,) = struct.unpack_from("<" + fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.scalar("Q")
        text = bytes(self.buf[self.pos:self.pos + n]).decode("utf-8", "replace")
        self.pos += n
        return text

    def value(self, kind: int):
        if kind == 8:
            return self.string()
        if kind == 9:
            item, count = self.scalar("I"), self.scalar("Q")
            if item == 8:  # skip strings (the vocabulary: 50k-150k of them) without decoding them
                for _ in range(count):
                    self.pos += struct.unpack_from("<Q", self.buf, self.pos)[0] + 8
                return count
            size = struct.calcsize(_SCALAR[item])
            self.pos += size * count
            return count  # arrays: only their length is kept
        return self.scalar(_SCALAR[kind])


def read_gguf_header(path: pathlib.Path) -> tuple[dict, dict[str, int]]:
    """(key/values, tensor name -> elements); arrays become their length. ValueError if the file
    is not a GGUF."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        if buf[:4] != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file (it does not start with the GGUF magic)")
        r = _Reader(memoryview(buf))
        r.pos = 4
        version = r.scalar("I")
        if version < 2:
            raise ValueError(f"{path} is GGUF version {version}; version 2 or later is supported")
        n_tensors, n_kv = r.scalar("Q"), r.scalar("Q")
        meta = {}
        for _ in range(n_kv):
            key = r.string()
            meta[key] = r.value(r.scalar("I"))
        tensors = {}
        for _ in range(n_tensors):
            name = r.string()
            dims = [r.scalar("Q") for _ in range(r.scalar("I"))]
            r.pos += 4 + 8  # type, offset
            n = 1
            for d in dims:
                n *= d
            tensors[name] = n
        r.buf.release()
    return meta, tensors


def _gguf_shape(path: pathlib.Path) -> ModelShape:
    try:
        meta, tensors = read_gguf_header(path)
    except (ValueError, struct.error, KeyError) as exc:
        raise ConfigError("model", f"{path}: cannot read the GGUF header ({exc})") from None
    arch = meta.get("general.architecture")
    if arch not in SERVED_ARCHITECTURES:
        raise ConfigError("model", f"{path.name}: GGUF architecture {arch!r} is not served; this engine runs "
                                   f"{', '.join(SERVED_ARCHITECTURES)} GGUFs and Hugging Face directories of "
                                   f"{', '.join(HF_ARCHITECTURES)} (docs/server.md, 'Models')")

    def key(name, default=None):
        value = meta.get(f"{arch}.{name}", default)
        if value is None:
            raise ConfigError("model", f"{path.name}: GGUF metadata lacks {arch}.{name}")
        return int(value)

    heads = key("attention.head_count")
    return ModelShape(path, arch, key("block_count"), key("attention.head_count_kv", heads),
                      key("attention.key_length", key("embedding_length") // heads), key("context_length"),
                      sum(tensors.values()), tensors.get("token_embd.weight", 0), "output.weight" not in tensors,
                      path.stat().st_size)


def _hf_shape(path: pathlib.Path) -> ModelShape:
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError("model", f"{path}: cannot read config.json ({exc})") from None
    archs = config.get("architectures") or [config.get("model_type")]
    arch = next((HF_ARCHITECTURES[a] for a in archs if a in HF_ARCHITECTURES), None)
    if arch is None:
        raise ConfigError("model", f"{path.name}: architecture {archs[0]!r} is not served; Hugging Face directories "
                                   f"of {', '.join(HF_ARCHITECTURES)} are")
    dim, heads, layers = config["hidden_size"], config["num_attention_heads"], config["num_hidden_layers"]
    kv, ffn, vocab = config.get("num_key_value_heads", heads), config["intermediate_size"], config["vocab_size"]
    head_dim = config.get("head_dim") or dim // heads
    per_layer = dim * head_dim * (heads + 2 * kv) + heads * head_dim * dim + 3 * dim * ffn + 2 * dim
    tied = config.get("tie_word_embeddings", False)
    params = vocab * dim * (1 if tied else 2) + layers * per_layer + dim
    for needed in ("tokenizer.json",):
        if not (path / needed).is_file():
            raise ConfigError("model", f"{path.name}: no {needed} (a served Hugging Face directory has config.json, "
                                       f"*.safetensors and tokenizer.json)")
    if not any(path.glob("*.safetensors")):
        raise ConfigError("model", f"{path.name}: no *.safetensors weights (.bin checkpoints are not read)")
    files = sum(p.stat().st_size for p in path.glob("*.safetensors"))
    return ModelShape(path, arch, layers, kv, head_dim, config.get("max_position_embeddings", 2048),
                      params, vocab * dim, bool(tied), files)


def model_shape(path: pathlib.Path) -> ModelShape:
    """The shape of a GGUF file or a Hugging Face model directory; ConfigError("model") naming the
    reason it cannot be served."""
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ConfigError("model", f"{path} is a directory without config.json (a Hugging Face model "
                                       f"directory has config.json, *.safetensors and tokenizer.json)")
        return _hf_shape(path)
    if not path.is_file():
        raise ConfigError("model", f"no such model file: {path}")
    return _gguf_shape(path)

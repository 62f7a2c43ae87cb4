"""Default request slots and context for `flare run`, sized from this machine's memory and the
model's KV footprint, the way llama.cpp (`-c 0`: the model's context) and vLLM (KV blocks fill a
fraction of the device memory, `max_num_seqs` caps the batch) size theirs.

Rule (all numbers are printed at startup, and `--slots` / `--max-context` override them):
- context: the model's trained context, capped at CONTEXT_CAP tokens. Past that, a prompt on a
  CPU takes tens of seconds to prefill, so a longer default only reserves memory nobody uses;
- slots: as many as fit KV_MEMORY_FRACTION of the physical memory left after the weights, each
  slot holding a whole context of float32 K/V, rounded down to a power of two (the decode graphs
  are power-of-two buckets, so 48 slots would run as 32 + 16) and capped at the 64 request slots
  that selection is bounded to.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from helios.errors import ConfigError

CONTEXT_CAP = 4096
KV_MEMORY_FRACTION = 0.4  # the rest stays for the weights' working copies, activations and the OS
MAX_SLOTS = 64  # selection is bounded to 64 request slots (backend.build_backend checks it)
FLOAT_BYTES = 4  # the KV cache is float32 like the model (engine/model/llama.py)
GIB = 1024 ** 3


@dataclass(frozen=True, slots=True)
class Capacity:
    """Chosen slots and context, with the figures they came from (for the startup line)."""

    slots: int
    max_context: int
    kv_bytes_per_token: int  # one token of one slot, all layers, K and V
    memory_bytes: int
    model_context: int
    chosen_slots: bool  # False when --slots set it
    chosen_context: bool

    @property
    def kv_bytes(self) -> int:
        return self.slots * self.max_context * self.kv_bytes_per_token

    def describe(self) -> str:
        def how(auto: bool) -> str:
            return "auto" if auto else "set"
        gib = 1024 ** 3
        return (f"{self.slots} request slots ({how(self.chosen_slots)}) x {self.max_context}-token context "
                f"({how(self.chosen_context)}; the model's is {self.model_context}): KV cache up to "
                f"{self.kv_bytes / gib:.1f} GiB of {self.memory_bytes / gib:.1f} GiB memory")


def kv_bytes_per_token(n_layers: int, n_kv_heads: int, head_dim: int) -> int:
    # K and V, each [n_kv_heads, head_dim] per layer, float32.
    return 2 * n_layers * n_kv_heads * head_dim * FLOAT_BYTES


def weight_bytes(c) -> int:
    """float32 weights as LlamaModel holds them on the CPU: every matrix once, plus oneDNN's packed
    copy of the output projection (a second copy of the tied embedding)."""
    per_layer = c.dim * (c.n_heads + 2 * c.n_kv_heads) * c.head_dim + c.n_heads * c.head_dim * c.dim \
        + 3 * c.dim * c.hidden_dim
    return FLOAT_BYTES * (2 * c.vocab_size * c.dim + c.n_layers * per_layer)


# Bytes per linear-weight element as each --weights format holds it (int8: per-channel scales are
# negligible); the token embedding stays float32 in every format. gguf counts as float32: its load
# decodes every block to float32 before packing int4 planes and a bfloat16 copy (about 2.6 bytes an
# element while serving, but the float32 peak is what must fit).
FORMAT_BYTES = {"fp32": 4, "bf16": 2, "int8": 1, "gguf": 4}


def serving_weight_bytes(shape, weights: str = "fp32") -> int:
    """Memory the model's weights take while serving (`shape`: helios.server.model_header.ModelShape).
    Loading dequantizes every tensor to float32 first, so the peak is at least params x 4 bytes."""
    per = FORMAT_BYTES.get(weights, FLOAT_BYTES)
    linear = shape.params - shape.embedding_params + (shape.embedding_params if shape.tied_embeddings else 0)
    return max(FLOAT_BYTES * shape.embedding_params + per * linear, FLOAT_BYTES * shape.params)


def physical_memory_bytes() -> int:
    """Total physical memory (POSIX sysconf; the memory a server of this machine may plan for)."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def choose_capacity(model_config, *, slots: int | None, max_context: int | None,
                    memory_bytes: int | None = None, weights_bytes: int | None = None) -> Capacity:
    """Fill in whichever of `slots` and `max_context` is None from memory and the model's KV size
    (`weights_bytes`: the weights' memory, default float32 `weight_bytes`)."""
    memory = physical_memory_bytes() if memory_bytes is None else memory_bytes
    weights = weight_bytes(model_config) if weights_bytes is None else weights_bytes
    per_token = kv_bytes_per_token(model_config.n_layers, model_config.n_kv_heads, model_config.head_dim)
    context = max_context if max_context is not None else min(model_config.max_context, CONTEXT_CAP)
    chosen = slots
    if chosen is None:
        budget = KV_MEMORY_FRACTION * (memory - weights)
        fit = int(budget // (per_token * context))
        if fit < 1:
            raise ConfigError("max_context", f"one {context}-token slot needs {per_token * context / GIB:.2f} GiB "
                                             f"of KV cache, and {KV_MEMORY_FRACTION:.0%} of the "
                                             f"{(memory - weights) / GIB:.1f} GiB left after the weights is "
                                             f"{budget / GIB:.2f} GiB; lower --max-context")
        chosen = min(MAX_SLOTS, 1 << (fit.bit_length() - 1))
    return Capacity(chosen, context, per_token, memory, model_config.max_context,
                    slots is None, max_context is None)


def check_weights_fit(shape, weights: str, memory: int) -> int:
    """The weights' memory; ConfigError("model") naming it when it alone exceeds this machine's."""
    need = serving_weight_bytes(shape, weights)
    if need >= memory:
        smaller = [f for f in FORMAT_BYTES if serving_weight_bytes(shape, f) < memory and f != weights]
        hint = (f"; --weights {smaller[0]} needs {serving_weight_bytes(shape, smaller[0]) / GIB:.1f} GiB"
                if smaller else "; choose a smaller model")
        raise ConfigError("model", f"{shape.path.name}: {shape.params / 1e9:.2f} B parameters need "
                                   f"{need / GIB:.1f} GiB of memory as {weights} weights (loading converts "
                                   f"them to float32), and this machine has {memory / GIB:.1f} GiB{hint}")
    return need


def resolve(engine: str, model: str | None, slots: int | None, max_context: int | None,
            weights: str = "fp32", memory_bytes: int | None = None) -> Capacity | None:
    """The torch engine's capacity for `flare run` (None for the sim engine, which keeps SIM_SLOTS
    and SIM_CONTEXT: it has no model to size for). Reads only the model file's header, so a model
    of the wrong architecture or too large for this machine is refused before torch loads."""
    if engine != "torch":
        return None
    import pathlib

    from helios.server.model_header import model_shape

    if model:
        path = pathlib.Path(model)
    else:
        from helios.engine.model_files import default_model_path

        path = default_model_path()
    shape = model_shape(path)
    memory = physical_memory_bytes() if memory_bytes is None else memory_bytes
    need = check_weights_fit(shape, weights, memory)
    return choose_capacity(shape, slots=slots, max_context=max_context, memory_bytes=memory, weights_bytes=need)


SIM_SLOTS, SIM_CONTEXT = 4, 1024

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


def physical_memory_bytes() -> int:
    """Total physical memory (POSIX sysconf; the memory a server of this machine may plan for)."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def choose_capacity(model_config, *, slots: int | None, max_context: int | None,
                    memory_bytes: int | None = None) -> Capacity:
    """Fill in whichever of `slots` and `max_context` is None from memory and the model's KV size."""
    memory = physical_memory_bytes() if memory_bytes is None else memory_bytes
    per_token = kv_bytes_per_token(model_config.n_layers, model_config.n_kv_heads, model_config.head_dim)
    context = max_context if max_context is not None else min(model_config.max_context, CONTEXT_CAP)
    chosen = slots
    if chosen is None:
        budget = KV_MEMORY_FRACTION * (memory - weight_bytes(model_config))
        fit = int(budget // (per_token * context))
        if fit < 1:
            raise ConfigError("max_context", f"one {context}-token slot needs {per_token * context} bytes of "
                                             f"KV cache; this machine has {memory} bytes; lower --max-context")
        chosen = min(MAX_SLOTS, 1 << (fit.bit_length() - 1))
    return Capacity(chosen, context, per_token, memory, model_config.max_context,
                    slots is None, max_context is None)


def resolve(engine: str, model: str | None, slots: int | None, max_context: int | None) -> Capacity | None:
    """The torch engine's capacity for `flare run` (None for the sim engine, which keeps SIM_SLOTS
    and SIM_CONTEXT: it has no model to size for)."""
    if engine != "torch":
        return None
    import pathlib

    from helios.engine.model import default_model_path, load_config

    path = pathlib.Path(model) if model else default_model_path()
    if not path.is_file():
        raise ConfigError("model", f"no such model file: {path}")
    return choose_capacity(load_config(path), slots=slots, max_context=max_context)


SIM_SLOTS, SIM_CONTEXT = 4, 1024

"""The real model: GGUF loading, tokenizer and a batched Llama forward (CPU, fp32).

Typical use::

    config, weights = load_weights()          # bundled SmolLM2-135M-Instruct
    model = LlamaModel(config, weights)
    tokenizer = Tokenizer.from_gguf()
    cache = KVCache(config, num_slots=8, max_context=2048)
"""

from helios.engine.model.llama import (
    KVCache,
    LlamaModel,
    apply_rope,
    generate_greedy,
    rms_norm,
    rope_tables,
)
from helios.engine.model.weights import WeightFormat
from helios.engine.model.loader import ModelConfig, default_model_path
from helios.engine.model.tokenizer import IncrementalDetokenizer, Tokenizer
# GGUF files and Hugging Face directories alike (helios.engine.model.files).
from helios.engine.model.files import load_config, load_tokenizer, load_weights

__all__ = [
    "IncrementalDetokenizer",
    "KVCache",
    "LlamaModel",
    "ModelConfig",
    "Tokenizer",
    "WeightFormat",
    "apply_rope",
    "default_model_path",
    "generate_greedy",
    "load_config",
    "load_tokenizer",
    "load_weights",
    "rms_norm",
    "rope_tables",
]

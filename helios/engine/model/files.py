"""A model from a path: a GGUF file (helios.engine.model.loader) or a Hugging Face directory
(helios.engine.model.hf); None is the bundled SmolLM2 GGUF."""

from __future__ import annotations

import pathlib

import torch

from helios.engine.model.hf import HFTokenizer, hf_config, hf_weights
from helios.engine.model.loader import ModelConfig
from helios.engine.model.loader import load_config as gguf_config
from helios.engine.model.loader import load_weights as gguf_weights
from helios.engine.model.tokenizer import Tokenizer


def _is_directory(path) -> bool:
    return path is not None and pathlib.Path(path).is_dir()


def load_config(path=None) -> ModelConfig:
    """The ModelConfig of a GGUF file or a Hugging Face directory."""
    return hf_config(path) if _is_directory(path) else gguf_config(path)


def load_weights(path=None) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """(config, float32 weights under GGUF names) of a GGUF file or a Hugging Face directory."""
    return hf_weights(path) if _is_directory(path) else gguf_weights(path)


def load_tokenizer(path=None) -> Tokenizer:
    """The tokenizer of a GGUF file or a Hugging Face directory."""
    if _is_directory(path):
        config = hf_config(path)
        return HFTokenizer(path, config.eos_id, config.vocab_size)
    return Tokenizer.from_gguf(path)

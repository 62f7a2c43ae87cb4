"""Hugging Face model directories: config.json, *.safetensors, tokenizer.json, tokenizer_config.json.

Served families: Llama (`LlamaForCausalLM`) and Qwen2 (`Qwen2ForCausalLM`: Llama's layer plus
biases on the q/k/v projections, and often a tied embedding). The weights are renamed to the GGUF
names the rest of helios.engine.model uses (`blk.{i}.attn_q.weight`, ...) and made float32; HF
stores Q/K rows in the rotate-half order LlamaModel uses, so unlike a GGUF nothing is permuted.
Refused with a clear error: RoPE scaling (Llama 3.1's "llama3", YaRN, ...), Qwen2's sliding-window
attention, other architectures.
"""

from __future__ import annotations

import json
import pathlib

import torch

from helios.engine.model.loader import ModelConfig
from helios.engine.model.tokenizer import Tokenizer

ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM")

_LAYER = {  # HF name inside model.layers.{i}. -> GGUF name inside blk.{i}.
    "input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias", "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
_TOP = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight"}


def _json(path: pathlib.Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def hf_config(directory) -> ModelConfig:
    """The ModelConfig of a Hugging Face Llama or Qwen2 directory; ValueError/NotImplementedError
    for what is not served."""
    directory = pathlib.Path(directory)
    c = _json(directory / "config.json")
    arch = next((a for a in c.get("architectures") or [] if a in ARCHITECTURES), None)
    if arch is None:
        raise ValueError(f"unsupported architecture {c.get('architectures')!r}: served are {', '.join(ARCHITECTURES)}")
    if c.get("rope_scaling"):
        raise NotImplementedError(f"RoPE scaling {c['rope_scaling']!r} is not supported")
    if c.get("use_sliding_window"):
        raise NotImplementedError("sliding-window attention is not supported")
    if c.get("hidden_act", "silu") != "silu":
        raise NotImplementedError(f"activation {c['hidden_act']!r} is not supported (SwiGLU with silu is)")
    heads = c["num_attention_heads"]
    eos = c.get("eos_token_id", _json(directory / "generation_config.json").get("eos_token_id"))
    if isinstance(eos, list):
        eos = eos[0]
    if eos is None:
        raise ValueError(f"{directory}: config.json has no eos_token_id")
    tied = bool(c.get("tie_word_embeddings", False))
    return ModelConfig(
        n_layers=c["num_hidden_layers"], dim=c["hidden_size"], n_heads=heads,
        n_kv_heads=c.get("num_key_value_heads") or heads, head_dim=c.get("head_dim") or c["hidden_size"] // heads,
        hidden_dim=c["intermediate_size"], vocab_size=c["vocab_size"], rope_base=float(c.get("rope_theta", 10000.0)),
        max_context=c.get("max_position_embeddings", 2048), norm_eps=float(c.get("rms_norm_eps", 1e-6)),
        tie_embeddings=tied, eos_id=int(eos), bos_id=None)


def hf_weights(directory) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """(config, float32 weights under GGUF names) of a Hugging Face directory."""
    from safetensors.torch import load_file

    directory = pathlib.Path(directory)
    config = hf_config(directory)
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{directory} holds no *.safetensors files")
    weights = {}
    for file in files:
        for name, tensor in load_file(str(file)).items():
            weights[_gguf_name(name)] = tensor.float().contiguous()
    if config.tie_embeddings:
        weights.pop("output.weight", None)
    elif "output.weight" not in weights:
        raise ValueError(f"{directory}: no lm_head.weight, and tie_word_embeddings is false")
    return config, weights


def _gguf_name(name: str) -> str:
    if name in _TOP:
        return _TOP[name]
    if name.startswith("model.layers."):
        index, _, rest = name[len("model.layers."):].partition(".")
        if rest in _LAYER:
            return f"blk.{index}.{_LAYER[rest]}"
    raise ValueError(f"unexpected tensor {name!r} for a Llama/Qwen2 model")


class HFTokenizer(Tokenizer):
    """A Tokenizer from tokenizer.json (the `tokenizers` library) and tokenizer_config.json (the
    chat template and the special tokens); the same interface as the GGUF one."""

    def __init__(self, directory, eos_id: int, vocab_size: int = 0):
        from tokenizers import Tokenizer as _HFTokenizer

        from helios.engine.model.tokenizer import _byte_decoder

        directory = pathlib.Path(directory)
        self._tk = _HFTokenizer.from_file(str(directory / "tokenizer.json"))
        cfg = _json(directory / "tokenizer_config.json")
        template = cfg.get("chat_template")
        if isinstance(template, list):  # named templates: the default one
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        self.chat_template = template
        self._eos_id = int(eos_id)
        # The embedding may have more rows than the tokenizer has tokens (padding): those ids decode to "".
        self._vocab_size = max(vocab_size, self._tk.get_vocab_size(with_added_tokens=True))
        added = self._tk.get_added_tokens_decoder()
        self.special_tokens = [t.content for t in added.values() if t.special]
        self._special_ids = {i for i, t in added.items() if t.special}
        table = _byte_decoder()

        def raw(i: int) -> bytes:
            tok = self._tk.id_to_token(i)
            if tok is None:
                return b""
            if i in added:
                return tok.encode()
            return bytes(table[c] for c in tok) if all(c in table for c in tok) else tok.encode()
        self._token_bytes = [raw(i) for i in range(self._vocab_size)]

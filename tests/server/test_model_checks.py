"""Issue 43: `--model` is checked from the file's header before torch loads. A wrong architecture,
a model whose weights exceed this machine's memory, a directory that is no model: each refused at
once with its real cause, one line, status 2."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from helios.engine.model_files import default_model_path
from helios.errors import ConfigError
from helios.server.model_header import model_shape, read_gguf_header
from helios.server.sizing import GIB, check_weights_fit, resolve, serving_weight_bytes

LLAMA_8B = dict(block_count=32, embedding_length=4096, feed_forward_length=14336, head_count=32, head_count_kv=8,
                vocab=128256)


def _header_only_gguf(path, arch: str, shape: dict) -> None:
    """A GGUF whose header declares a whole model's tensors (F32) but holds no tensor data: the
    checks read only the header, and a loader would fail, so a pass would show."""
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(shape["block_count"])
    w.add_embedding_length(shape["embedding_length"])
    w.add_feed_forward_length(shape["feed_forward_length"])
    w.add_head_count(shape["head_count"])
    w.add_head_count_kv(shape["head_count_kv"])
    w.add_context_length(8192)
    w.add_token_list([f"t{i}" for i in range(1000)])  # a vocabulary to skip over
    d, f, v = shape["embedding_length"], shape["feed_forward_length"], shape["vocab"]
    kv = d // shape["head_count"] * shape["head_count_kv"]

    def tensor(name, rows, cols):
        w.add_tensor_info(name, (rows, cols), np.dtype(np.float32), rows * cols * 4)
    tensor("token_embd.weight", v, d)
    tensor("output.weight", v, d)
    for i in range(shape["block_count"]):
        for name, rows, cols in (("attn_q", d, d), ("attn_k", kv, d), ("attn_v", kv, d), ("attn_output", d, d),
                                 ("ffn_gate", f, d), ("ffn_up", f, d), ("ffn_down", d, f)):
            tensor(f"blk.{i}.{name}.weight", rows, cols)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()


def test_header_gives_the_shape_of_the_bundled_model():
    shape = model_shape(default_model_path())
    assert (shape.architecture, shape.n_layers, shape.n_kv_heads, shape.head_dim) == ("llama", 30, 3, 64)
    assert 134e6 < shape.params < 136e6 and shape.tied_embeddings  # SmolLM2-135M
    meta, tensors = read_gguf_header(default_model_path())
    assert meta["tokenizer.ggml.tokens"] == 49152 and len(tensors) == 272  # arrays: their length


def test_a_llama_8b_in_fp32_does_not_fit_24_gib_and_the_message_says_why(tmp_path):
    path = tmp_path / "llama-8b.gguf"
    _header_only_gguf(path, "llama", LLAMA_8B)
    shape = model_shape(path)
    assert 8.0e9 < shape.params < 8.1e9
    with pytest.raises(ConfigError, match=r"8\.03 B parameters need 29\.9 GiB of memory as fp32 weights .* this "
                                          r"machine has 23\.5 GiB"):
        check_weights_fit(shape, "fp32", int(23.5 * GIB))
    # Loading converts every tensor to float32 first, so bf16 serving does not lower the need below it.
    assert serving_weight_bytes(shape, "bf16") == serving_weight_bytes(shape, "fp32")
    assert resolve("torch", str(path), None, None, memory_bytes=64 * GIB).slots >= 1


@pytest.mark.parametrize("arch,needle", [("qwen2", "GGUF architecture 'qwen2' is not served"),
                                         ("llama", "need 29.9 GiB of memory")])
def test_flare_run_refuses_before_torch_loads(tmp_path, arch, needle):
    path = tmp_path / "model.gguf"
    _header_only_gguf(path, arch, LLAMA_8B)
    code = ("import sys\nfrom helios.server import sizing\n"
            "sizing.physical_memory_bytes = lambda: int(23.5 * 1024 ** 3)\n"
            "from helios.cli import main\n"
            f"rc = main(['run', '--model', {str(path)!r}])\n"
            "print(rc, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["2", "False"], out.stderr
    assert out.stderr.count("\n") == 1 and "--model" in out.stderr and needle in out.stderr, out.stderr


def test_directories_without_a_model_are_refused_by_name(tmp_path):
    with pytest.raises(ConfigError, match="without config.json"):
        model_shape(tmp_path)
    (tmp_path / "config.json").write_text('{"architectures": ["LlamaForCausalLM"], "hidden_size": 64, '
                                          '"num_attention_heads": 4, "num_hidden_layers": 2, '
                                          '"intermediate_size": 96, "vocab_size": 320}')
    with pytest.raises(ConfigError, match="no tokenizer.json"):
        model_shape(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(ConfigError, match="no \\*.safetensors"):
        model_shape(tmp_path)
    (tmp_path / "config.json").write_text('{"architectures": ["GPT2LMHeadModel"]}')
    with pytest.raises(ConfigError, match="'GPT2LMHeadModel' is not served"):
        model_shape(tmp_path)
    (tmp_path / "not.gguf").write_bytes(b"PK\x03\x04 a zip")
    with pytest.raises(ConfigError, match="not a GGUF file"):
        model_shape(tmp_path / "not.gguf")

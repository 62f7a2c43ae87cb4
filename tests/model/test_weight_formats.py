"""The faster CPU weight formats (`--weights gguf|bf16|int8`): close to float32, sensible answers
(the golden "Paris" included), and clear errors where a format cannot run."""

import pytest
import torch

from helios.engine.model import KVCache, LlamaModel, Tokenizer, WeightFormat, generate_greedy, load_weights
from helios.engine.model import weights as weight_formats
from helios.engine.model.int8 import int8_available
from helios.engine.model.loader import load_quantized
from helios.engine.model.quant import int4pack_available
from helios.engine.torch_core import load_model
from helios.errors import ConfigError

AVAILABLE = {WeightFormat.GGUF: int4pack_available(), WeightFormat.BF16: weight_formats.bf16_available(),
             WeightFormat.INT8: int8_available()}


@pytest.fixture(scope="module")
def models():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in test_forward: one thread degrades gently on a shared box
    config, weights = load_weights()
    quantized = load_quantized() if AVAILABLE[WeightFormat.GGUF] else None
    built = {fmt: LlamaModel(config, weights, weight_format=fmt, quantized=quantized)
             for fmt in (WeightFormat.FLOAT32, *(f for f, ok in AVAILABLE.items() if ok))}
    yield built, Tokenizer.from_gguf()
    torch.set_num_threads(threads)


def _last_logits(model, ids):
    cache = KVCache(model.config, num_slots=1, max_context=256)
    tokens = torch.tensor([ids])
    return model(tokens, torch.arange(len(ids))[None], torch.tensor([0]), cache,
                 logits_at=torch.tensor([len(ids) - 1]))[0, -1]


@pytest.mark.parametrize("fmt", [WeightFormat.GGUF, WeightFormat.BF16, WeightFormat.INT8], ids=lambda f: f.value)
def test_a_faster_format_stays_close_to_float32_and_answers_sensibly(models, fmt):
    if not AVAILABLE[fmt]:
        pytest.skip(f"{fmt.value} weights need CPU support this machine lacks")
    built, tok = models
    ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}]))
    reference, fast = _last_logits(built[WeightFormat.FLOAT32], ids), _last_logits(built[fmt], ids)
    assert fast.dtype == torch.float32
    assert torch.nn.functional.cosine_similarity(reference, fast, dim=0) > 0.95  # int8 0.977 here, gguf 0.99998
    assert int(reference.argmax()) in fast.topk(5).indices.tolist()
    cache = KVCache(built[fmt].config, num_slots=1, max_context=256)
    assert "Paris" in tok.decode(generate_greedy(built[fmt], tok, ids, 12, cache))


def test_bf16_refuses_a_cpu_without_native_bfloat16(monkeypatch):
    monkeypatch.setattr(weight_formats, "bf16_available", lambda: False)
    with pytest.raises(RuntimeError, match="AMX or AVX512-BF16"):
        weight_formats.linear(torch.randn(4, 4), True, weight_formats.WeightFormat.BF16)


@pytest.mark.parametrize("fmt", ["bf16", "int8"])
def test_the_cpu_formats_are_refused_on_another_device_before_loading(fmt):
    with pytest.raises(ConfigError, match="CPU format"):
        load_model(device="cuda", weights=fmt)


def test_bf16_on_a_cpu_without_it_is_a_config_error(monkeypatch):
    import helios.engine.torch_core as torch_core

    monkeypatch.setattr(torch_core, "bf16_available", lambda: False)
    with pytest.raises(ConfigError, match="natively"):
        load_model(weights="bf16")


def test_gguf_runs_the_files_quantized_layers_and_a_float32_head(models):
    from helios.engine.model.quant import QuantLinear

    built, _ = models
    if WeightFormat.GGUF not in built:
        pytest.skip("no CPU int4 kernel in this torch")
    model = built[WeightFormat.GGUF]
    layer = model.layers[0]
    assert all(isinstance(m, QuantLinear) for m in (layer.wqkv, layer.wo, layer.w13, layer.w2))
    assert not isinstance(model.output, QuantLinear)  # the Q8_0 head: float32 logits (weights.linear)
    # An unquantized model (no file groups) under GGUF is exactly float32's.
    config = model.config
    plain = weight_formats.linear(torch.randn(32, 64), True, WeightFormat.GGUF, None)
    assert not isinstance(plain, QuantLinear) and plain.dtype is torch.float32 and config.dim == 576

"""Issue 43: Hugging Face model directories (config.json, *.safetensors, tokenizer.json, the chat
template from tokenizer_config.json) for the Llama and Qwen2 families, checked against
`transformers` on tiny random models made here: the logits match to float tolerance."""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from helios.engine.model import KVCache, LlamaModel, load_tokenizer, load_weights  # noqa: E402
from helios.engine.model.hf import hf_config  # noqa: E402

TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _tokenizer(directory) -> None:
    """A small byte-level BPE tokenizer.json (trained here) with two special tokens."""
    from tokenizers import Tokenizer as HFTok, decoders, models, pre_tokenizers, trainers

    tk = HFTok(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tk.train_from_iterator(["the quick brown fox jumps over the lazy dog; héllo wörld 123"] * 50, trainer)
    tk.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({"chat_template": TEMPLATE,
                                                                 "eos_token": "<|im_end|>"}))


def _model(kind: str, directory, tied: bool):
    torch.manual_seed(0)
    common = dict(vocab_size=320, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=2048, rms_norm_eps=1e-5, rope_theta=10000.0,
                  tie_word_embeddings=tied, eos_token_id=1)
    if kind == "llama":
        config, cls = transformers.LlamaConfig(**common), transformers.LlamaForCausalLM
    else:
        config, cls = transformers.Qwen2Config(**common, use_sliding_window=False), transformers.Qwen2ForCausalLM
    model = cls(config).eval()
    with torch.no_grad():  # random biases (zero at init) so Qwen2's q/k/v biases are exercised
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.5)
    model.save_pretrained(directory, safe_serialization=True)
    _tokenizer(directory)
    return model


@pytest.mark.parametrize("kind,tied", [("llama", False), ("qwen2", True), ("qwen2", False)])
def test_logits_match_transformers(tmp_path, kind, tied):
    reference = _model(kind, tmp_path, tied)
    config, weights = load_weights(tmp_path)
    assert config.tie_embeddings == tied and (kind == "qwen2") == ("blk.0.attn_q.bias" in weights)
    model = LlamaModel(config, weights).eval()
    ids = torch.tensor([[5, 17, 42, 99, 3, 250, 7, 11, 300, 64]])
    with torch.no_grad():
        expected = reference(ids).logits
        cache = KVCache(config, num_slots=1, max_context=64)
        got = model(ids, torch.arange(ids.shape[1])[None], torch.tensor([0]), cache)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


def test_tokenizer_and_chat_template_come_from_the_directory(tmp_path):
    _model("qwen2", tmp_path, True)
    from tokenizers import Tokenizer as HFTok

    reference = HFTok.from_file(str(tmp_path / "tokenizer.json"))
    tok = load_tokenizer(tmp_path)
    text = tok.apply_chat_template([{"role": "user", "content": "héllo wörld"}])
    assert text == "<|im_start|>user\nhéllo wörld<|im_end|>\n<|im_start|>assistant\n"
    ids = tok.encode(text)
    assert ids == reference.encode(text, add_special_tokens=False).ids
    assert tok.decode(ids) == text
    assert b"".join(tok.token_bytes(i) for i in ids).decode() == text  # the streaming detokenizer's bytes
    assert tok.is_special(ids[0]) and tok.vocab_size == 320  # the embedding's rows (padding decodes to "")
    assert tok.eos_id == hf_config(tmp_path).eos_id


def test_unserved_directories_are_refused_by_name(tmp_path):
    _model("llama", tmp_path, False)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "rope_scaling": {"rope_type": "llama3",
                                                                                 "factor": 8.0}}))
    with pytest.raises(NotImplementedError, match="RoPE scaling"):
        hf_config(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**config, "architectures": ["MistralForCausalLM"]}))
    with pytest.raises(ValueError, match="unsupported architecture"):
        hf_config(tmp_path)


def test_flare_run_serves_a_directory(tmp_path):
    from tests.server.support import FlareServer  # noqa: PLC0415
    import httpx

    _model("qwen2", tmp_path, True)
    server = FlareServer("--model", str(tmp_path), "--slots", "2", "--max-context", "256", "--prefill-capacity",
                         "64", "--no-warmup")
    assert server.ready_line, server.error_text()
    try:
        r = httpx.post(server.url + "/v1/chat/completions", timeout=60,
                       json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        body = r.json()
        assert r.status_code == 200 and body["model"] == tmp_path.name and body["usage"]["completion_tokens"] == 4
        tokens = httpx.post(server.url + "/tokenize", json={"messages": [{"role": "user", "content": "hi"}]}).json()
        assert tokens["count"] == body["usage"]["prompt_tokens"]
    finally:
        assert server.stop() == 0


def test_tensor_parallel_shards_carry_qwen2_biases(tmp_path):
    """Each rank gets the q/k/v bias rows of its own heads: the shards put together are the whole."""
    from helios.engine.sharding import shard_weights

    _model("qwen2", tmp_path, True)
    config, weights = load_weights(tmp_path)
    shards = [shard_weights(config, weights, rank, 2)[1] for rank in range(2)]
    for name in ("attn_q.bias", "attn_k.bias", "attn_v.bias"):
        whole = torch.cat([s[f"blk.1.{name}"] for s in shards])
        assert torch.equal(whole, weights[f"blk.1.{name}"]), name
        assert shards[0][f"blk.1.{name}"].shape[0] == weights[f"blk.1.{name}"].shape[0] // 2

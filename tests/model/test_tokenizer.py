"""Tokenizer built from GGUF metadata: round trips, special tokens, ChatML, streaming."""

import pytest

from helios.engine.model.tokenizer import IncrementalDetokenizer, Tokenizer, _hand_chatml

TEXTS = [
    "Hello world!",
    "What is the capital of France?",
    "Prices: 12345.67 and 2024-06-01",
    "  two leading spaces\n\n\ttab",
    "héllo wörld — naïve café 日本語 Привет",
    "emoji 🎉👍🏽 and 👨‍👩‍👧",
]


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.from_gguf()


def test_basics(tok):
    assert tok.vocab_size == 49152
    assert tok.eos_id == 2


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip(tok, text):
    ids = tok.encode(text)
    assert ids and all(0 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == text


def test_no_bos_and_digits_split(tok):
    assert tok.encode("Hi")[0] != 1
    # individual_digits: each digit is its own token
    assert len(tok.encode("12345")) == 5


def test_special_tokens_single_ids(tok):
    assert tok.encode("<|im_end|>") == [2]
    assert tok.encode("<|im_start|>") == [1]
    assert tok.encode("<|endoftext|>") == [0]
    ids = tok.encode("<|im_start|>user\nhi<|im_end|>\n")
    assert ids[0] == 1 and 2 in ids
    assert tok.decode(ids, skip_special_tokens=True) == "user\nhi\n"


def test_chat_template(tok):
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    assert tok.apply_chat_template(msgs) == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
        "<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    with_system = [{"role": "system", "content": "Be brief."}, *msgs,
                   {"role": "assistant", "content": "Paris."}]
    text = tok.apply_chat_template(with_system, add_generation_prompt=False)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n"
        "What is the capital of France?<|im_end|>\n<|im_start|>assistant\nParis.<|im_end|>\n"
    )
    # The jinja-free fallback renders the same text.
    for m, gen in ((msgs, True), (with_system, False)):
        assert _hand_chatml(m, gen, tok._default_system()) == tok.apply_chat_template(m, gen)


@pytest.mark.parametrize("text", TEXTS)
def test_incremental_detokenizer(tok, text):
    ids = tok.encode(text)
    detok = IncrementalDetokenizer(tok)
    pieces = [detok.feed([i]) for i in ids]
    pieces.append(detok.flush())
    assert "".join(pieces) == tok.decode(ids)
    assert all("\ufffd" not in p for p in pieces)  # never a partial character


def test_incremental_detokenizer_emoji_held_back(tok):
    ids = tok.encode("🎉")
    assert len(ids) > 1  # the emoji's 4 bytes span several byte-level tokens
    detok = IncrementalDetokenizer(tok)
    outs = [detok.feed([i]) for i in ids]
    assert outs[:-1] == [""] * (len(ids) - 1) and outs[-1] == "🎉"
    # Bursts of several ids work too, and a cut-off character flushes as U+FFFD.
    detok = IncrementalDetokenizer(tok)
    assert detok.feed(tok.encode("ok ") + ids[:1]) == "ok "
    assert detok.flush() == tok.decode(ids[:1]) == "\ufffd"

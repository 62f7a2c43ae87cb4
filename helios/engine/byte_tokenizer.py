"""ByteTokenizer: token id = byte value, plus an EOS id; the tokenizer of the echo engine and tests."""

from __future__ import annotations


class ByteTokenizer:
    """Token id = byte value, plus an EOS id (256); a ChatML-like template."""

    eos_id = 256
    vocab_size = 257

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

    def token_bytes(self, token_id: int) -> bytes:
        return bytes([token_id]) if token_id < 256 else b""

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True, **variables) -> str:
        # The template reads no further variables (chat_template_kwargs), as SmolLM2's reads none.
        text = "".join(f"<|{m['role']}|>{m['content']}\n" for m in messages)
        return text + ("<|assistant|>" if add_generation_prompt else "")

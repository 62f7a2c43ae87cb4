"""Byte-level BPE tokenizer and ChatML template, built from GGUF metadata."""

from __future__ import annotations

import codecs
import re

from tokenizers import AddedToken, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as _HFTokenizer

from helios.engine.model.loader import open_gguf, read_metadata

_SPECIAL = 3  # llama.cpp token_type CONTROL: <|im_start|>, <|im_end|>, ...


def _byte_decoder() -> dict[str, int]:
    # GPT-2's reversible byte <-> printable-unicode map used by ByteLevel BPE:
    # printable Latin-1 bytes map to themselves, the other 68 bytes are shifted
    # to code points 256.. in byte order.
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars, n = {}, 0
    for b in range(256):
        if b in keep:
            chars[chr(b)] = b
        else:
            chars[chr(256 + n)] = b
            n += 1
    return chars


def _hand_chatml(messages, add_generation_prompt, default_system) -> str:
    # Same output as SmolLM2's jinja template, for when jinja2 is unavailable.
    parts = []
    if default_system is not None and messages and messages[0]["role"] != "system":
        parts.append(f"<|im_start|>system\n{default_system}<|im_end|>\n")
    for m in messages:
        parts.append(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n")
    if add_generation_prompt:
        parts.append("<|im_start|>assistant\n")
    return "".join(parts)


class Tokenizer:
    """GPT-2 style byte-level BPE tokenizer (no BOS) with a ChatML template.

    Build it with :meth:`from_gguf`; ``encode`` recognises special tokens such
    as ``<|im_start|>`` in the text and maps each to its single id.
    """

    def __init__(self, tokens, merges, token_types, eos_id, chat_template=None):
        vocab = {tok: i for i, tok in enumerate(tokens)}
        # GGUF stores merges as "left right" strings; tokenizers wants pairs.
        pairs = [tuple(m.split(" ", 1)) for m in merges]
        bpe = models.BPE(vocab, pairs, fuse_unk=False, byte_fallback=False)
        tk = _HFTokenizer(bpe)
        # SmolLM2 ("smollm" pre-tokenizer): every digit is its own pre-token,
        # then GPT-2's regex split with bytes mapped to printable characters.
        tk.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )
        tk.decoder = decoders.ByteLevel()
        self.special_tokens = [t for t, ty in zip(tokens, token_types) if ty == _SPECIAL]
        tk.add_special_tokens(
            [AddedToken(t, special=True, normalized=False) for t in self.special_tokens]
        )
        self._tk = tk
        self._eos_id = int(eos_id)
        self._vocab_size = len(tokens)
        self.chat_template = chat_template
        self._special_ids = {vocab[t] for t in self.special_tokens}
        # Raw bytes of every token, for exact incremental UTF-8 decoding. This
        # mirrors the ByteLevel decoder: a token made only of mapped chars
        # yields those bytes, anything else (special tokens) its UTF-8 text.
        table = _byte_decoder()
        self._token_bytes = [
            bytes(table[c] for c in tok) if all(c in table for c in tok) else tok.encode()
            for tok in tokens
        ]

    @classmethod
    def from_gguf(cls, path=None) -> "Tokenizer":
        """Build from the ``tokenizer.ggml.*`` keys of a GGUF (default: SmolLM2)."""
        meta = read_metadata(open_gguf(path))
        if meta.get("tokenizer.ggml.model") != "gpt2":
            raise ValueError(
                f"unsupported tokenizer model {meta.get('tokenizer.ggml.model')!r}:"
                " only byte-level BPE ('gpt2') is implemented"
            )
        return cls(
            meta["tokenizer.ggml.tokens"],
            meta["tokenizer.ggml.merges"],
            meta["tokenizer.ggml.token_type"],
            meta["tokenizer.ggml.eos_token_id"],
            meta.get("tokenizer.chat_template"),
        )

    @property
    def eos_id(self) -> int:
        return self._eos_id

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    def hf_json(self) -> str:
        """The underlying HF `tokenizers` model, serialized (for grammar libraries)."""
        return self._tk.to_str()

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; no BOS is added."""
        return self._tk.encode(text, add_special_tokens=False).ids

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        """Text of ``ids``; invalid UTF-8 becomes U+FFFD."""
        return self._tk.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes that token ``token_id`` stands for."""
        return self._token_bytes[token_id]

    def is_special(self, token_id: int) -> bool:
        return token_id in self._special_ids

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            **variables) -> str:
        """Render ``[{"role", "content"}, ...]`` as a ChatML prompt string.

        Uses the GGUF's own jinja template when jinja2 is installed (SmolLM2's
        adds a default system prompt when the first message is not 'system'),
        otherwise an equivalent hand-written ChatML renderer. ``variables`` are
        further template variables (vLLM's chat_template_kwargs, such as
        ``enable_thinking``); a template that does not read one ignores it, as
        the hand-written renderer (SmolLM2's template reads none) does.
        """
        if self.chat_template:
            try:
                from jinja2.sandbox import ImmutableSandboxedEnvironment
            except ImportError:
                pass
            else:
                # Same environment options as transformers' template renderer.
                env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
                template = env.from_string(self.chat_template)
                return template.render(
                    **variables, messages=messages, add_generation_prompt=add_generation_prompt
                )
        return _hand_chatml(messages, add_generation_prompt, self._default_system())

    def _default_system(self) -> str | None:
        # The system prompt baked into the jinja template, if there is one.
        match = re.search(r"<\|im_start\|>system\n(.*?)<\|im_end\|>", self.chat_template or "")
        return match.group(1) if match else None


class IncrementalDetokenizer:
    """Turn a stream of token ids into text without splitting characters.

    ``feed`` returns only text made of complete UTF-8 characters; bytes of a
    multi-byte character cut across tokens are held back until the rest
    arrives. The concatenation of all ``feed`` results plus ``flush()`` equals
    ``tokenizer.decode(all_ids)``.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = False):
        self._tokenizer = tokenizer
        self._skip_special = skip_special_tokens
        # Python's incremental decoder buffers incomplete sequences and, like
        # the Rust decode, replaces invalid bytes with U+FFFD once they are
        # known to be invalid, so streamed and one-shot text agree.
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, ids) -> str:
        """Add a burst of token ids; return the newly completed text."""
        tk = self._tokenizer
        data = b"".join(
            tk.token_bytes(i) for i in ids if not (self._skip_special and tk.is_special(i))
        )
        return self._utf8.decode(data)

    def flush(self) -> str:
        """End of stream: return what is held back (U+FFFD for a cut-off char)."""
        text = self._utf8.decode(b"", final=True)
        self._utf8.reset()
        return text

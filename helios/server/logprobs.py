"""Log-probabilities in OpenAI's two response shapes, from the runtime's per-token entries.

- /v1/completions (`logprobs: k`): `{"tokens", "token_logprobs", "top_logprobs", "text_offset"}`,
  each top_logprobs entry a `{token text: logprob}` map of the k most likely tokens plus the
  chosen one (so up to k + 1 keys, as OpenAI documents);
- /v1/chat/completions (`logprobs: true`, `top_logprobs: k`): `{"content": [{"token", "logprob",
  "bytes", "top_logprobs": [{"token", "logprob", "bytes"}, ...k]}]}`.
A token's text is its own decoding; `bytes` are its raw bytes (a token may hold part of a UTF-8
character, whose text is then U+FFFD). Log-probabilities are of the model's raw distribution,
before logit bias, penalties, temperature and filters (vLLM's default). An entry the core did
not give is null, and so is the first token of an echoed prompt, which nothing predicts.
"""

from __future__ import annotations

from typing import Sequence

from helios.engine.core import TokenLogprobs


class LogprobsFormatter:
    """Builds the logprobs objects of one request's choices, or of their chunks, in the
    endpoint's shape; it follows each choice's text offset from chunk to chunk."""

    def __init__(self, tokenizer, chat: bool):
        self.tokenizer = tokenizer
        self.chat = chat
        self._text: dict[int, str] = {}
        self._offsets: dict[int, int] = {}  # choice index -> text offset of its next token

    def _token(self, token_id: int) -> str:
        if (text := self._text.get(token_id)) is None:
            text = self._text[token_id] = self.tokenizer.decode([token_id])
        return text

    def _bytes(self, token_id: int) -> list[int]:
        raw = getattr(self.tokenizer, "token_bytes", None)
        return list(raw(token_id) if callable(raw) else self._token(token_id).encode("utf-8"))

    def build(self, index: int, token_ids: Sequence[int], entries: Sequence[TokenLogprobs | None]) -> dict:
        """The logprobs of choice `index`'s next `token_ids`: its echoed prompt's first, when it
        has one, then its output's."""
        if self.chat:
            return {"content": [self._chat_entry(t, e) for t, e in zip(token_ids, entries)]}
        tokens = [self._token(t) for t in token_ids]
        offsets, offset = [], self._offsets.get(index, 0)
        for text in tokens:
            offsets.append(offset)
            offset += len(text)
        self._offsets[index] = offset
        return {"tokens": tokens,
                "token_logprobs": [None if e is None else e.logprob for e in entries],
                "top_logprobs": [None if e is None else self._top_map(t, e) for t, e in zip(token_ids, entries)],
                "text_offset": offsets}

    def _top_map(self, token_id: int, entry: TokenLogprobs) -> dict[str, float]:
        top = {self._token(t): lp for t, lp in entry.top}
        top.setdefault(self._token(token_id), entry.logprob)  # the chosen token is always reported
        return top

    def _chat_entry(self, token_id: int, entry: TokenLogprobs | None) -> dict:
        return {"token": self._token(token_id), "logprob": None if entry is None else entry.logprob,
                "bytes": self._bytes(token_id),
                "top_logprobs": [] if entry is None else [
                    {"token": self._token(t), "logprob": lp, "bytes": self._bytes(t)} for t, lp in entry.top]}

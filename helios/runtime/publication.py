"""Publication: turning committed token bursts into visible text, safely.

Two hazards are handled here, per request:
- UTF-8: a character whose bytes are split across tokens must be emitted whole, never as U+FFFD.
- Stop strings: a stop string split across bursts must never leak, so any suffix that could still
  become a stop string is held back until it is disproved or completed.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass
from typing import Protocol, Sequence

REPLACEMENT = "\ufffd"


class Tokenizer(Protocol):
    def decode(self, ids: Sequence[int]) -> str: ...


class IncrementalDecoder:
    """Decodes a growing id sequence and returns only the newly stable text.

    It decodes a sliding window (the previous burst plus the new one) rather than the whole
    history, so each step costs O(burst), and the window's prefix gives tokenizers that
    strip leading spaces the context they need. Text ending in U+FFFD is held back: it is
    usually a multi-byte character whose remaining bytes are in the next token.
    """

    def __init__(self, tokenizer: Tokenizer):
        self._decode = tokenizer.decode
        self._ids: list[int] = []
        self._prefix = 0  # start of the decode window
        self._read = 0  # ids before this were already emitted as text

    def push(self, ids: Sequence[int]) -> str:
        self._ids.extend(ids)
        return self._advance(final=False)

    def flush(self) -> str:
        """End of stream: emit what was held back, replacement characters included."""
        return self._advance(final=True)

    def _advance(self, final: bool) -> str:
        if self._read == len(self._ids):
            return ""
        seen = self._decode(self._ids[self._prefix:self._read])
        full = self._decode(self._ids[self._prefix:])
        if len(full) <= len(seen) or (not final and full.endswith(REPLACEMENT)):
            return ""
        self._prefix, self._read = self._read, len(self._ids)
        return full[len(seen):]


class ByteDecoder:
    """Exact, O(1)-per-token decoding for tokenizers that expose each token's raw bytes."""

    def __init__(self, tokenizer):
        self._bytes = tokenizer.token_bytes
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, ids: Sequence[int]) -> str:
        return self._utf8.decode(b"".join(self._bytes(int(i)) for i in ids))

    def flush(self) -> str:
        return self._utf8.decode(b"", final=True)


def make_decoder(tokenizer):
    return ByteDecoder(tokenizer) if callable(getattr(tokenizer, "token_bytes", None)) else IncrementalDecoder(tokenizer)


@dataclass(frozen=True, slots=True)
class Piece:
    """What one burst makes visible: text, the token ids it accounts for, whether a stop
    string ended the response, and (for a request that asked) one log-probability entry per id."""

    text: str = ""
    token_ids: tuple[int, ...] = ()
    stopped: bool = False
    logprobs: tuple | None = None

    def then(self, other: Piece) -> Piece:
        logprobs = None if self.logprobs is None and other.logprobs is None else \
            (self.logprobs or ()) + (other.logprobs or ())
        return Piece(self.text + other.text, self.token_ids + other.token_ids, self.stopped or other.stopped,
                     logprobs)


def held_suffix(text: str, stops: Sequence[str]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of some stop string."""
    best = 0
    for stop in stops:
        for k in range(min(len(stop) - 1, len(text)), best, -1):
            if text.endswith(stop[:k]):
                best = k
                break
    return best


class Publication:
    """Per-request publication state: decoder, stop-string holdback, ids not yet shown.

    With no tokenizer, text is always empty and every burst's ids are visible at once.
    Token ids travel with the text they produced: ids whose text is still held back are
    attached to the next piece that shows text, so a client never sees ids of a cut stop string
    before the text decision is made. With `logprobs`, each id's log-probability entry travels
    with it.
    """

    def __init__(self, tokenizer: Tokenizer | None, stops: Sequence[str] = (), logprobs: bool = False,
                 include_stop: bool = False, skip_special: bool = False):
        self._decoder = make_decoder(tokenizer) if tokenizer is not None else None
        # vLLM's skip_special_tokens: special tokens (a tokenizer's is_special) show no text; their
        # ids are still counted and streamed.
        self._special = getattr(tokenizer, "is_special", None) if skip_special else None
        self._stops = tuple(stops)
        self._include_stop = include_stop  # vLLM's include_stop_str_in_output: the stop string is shown
        self._held = ""  # decoded text held back because it may start a stop string
        self._ids: list[int] = []  # ids whose text has not been shown yet
        self._entries: list | None = [] if logprobs else None  # their log-probability entries
        self._stopped = False  # after a stop string nothing more is ever shown

    @property
    def logprobs(self) -> bool:
        return self._entries is not None

    @property
    def has_text(self) -> bool:
        return self._decoder is not None

    def feed(self, ids: Sequence[int], entries: Sequence | None = None) -> Piece:
        """Show what `ids` make visible; `entries` are their log-probability entries (one per id,
        None for a missing one) when the request asked for them."""
        ids = tuple(int(i) for i in ids)
        if self._stopped:
            return Piece()
        if self._entries is not None:
            given = tuple(entries or ())[:len(ids)]
            self._entries.extend(given + (None,) * (len(ids) - len(given)))
        self._ids.extend(ids)
        if self._decoder is None:
            return self._take("", stopped=False)
        shown = ids if self._special is None else [i for i in ids if not self._special(i)]
        return self._release(self._held + self._decoder.push(shown), final=False)

    def flush(self) -> Piece:
        """End of stream: release everything still held (a stop string may still complete)."""
        if self._decoder is None or self._stopped:
            return Piece()
        return self._release(self._held + self._decoder.flush(), final=True)

    def _release(self, text: str, final: bool) -> Piece:
        # The earliest stop string ends the text; at one position, the first listed.
        found = min(((i, n, s) for n, s in enumerate(self._stops) if (i := text.find(s)) >= 0), default=None)
        if found is not None:
            cut, _, stop = found
            self._held, self._stopped = "", True
            return self._take(text[:cut + len(stop) if self._include_stop else cut], stopped=True)
        keep = 0 if final else held_suffix(text, self._stops)
        shown, self._held = text[:len(text) - keep], text[len(text) - keep:]
        if not shown and not final:
            return Piece()
        return self._take(shown, stopped=False)

    def _take(self, text: str, stopped: bool) -> Piece:
        ids, self._ids = tuple(self._ids), []
        entries = None
        if self._entries is not None:
            entries, self._entries = tuple(self._entries), []
        return Piece(text, ids, stopped, entries)

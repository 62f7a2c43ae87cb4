"""Structured output: a request's grammar masks the tokens it may emit (llguidance).

A request attaches with GRAMMAR_OPTION, a grammar in llguidance's serialized form (from
`json_schema_grammar` or `text_grammar`). Its Constraint follows the committed output: every sampled position
allows only tokens that keep the output a prefix of the grammar's language, and once the
grammar is complete only EOS. Speculation stays lossless because a constrained request is
offered no drafts: its rounds verify the pending token alone.
"""

from __future__ import annotations

from typing import Sequence

import llguidance
import numpy as np
import torch

from helios.errors import InvalidRequest

GRAMMAR_OPTION = "grammar"
# One layout, `{"a": 1, "b": [2, 3]}`: with flexible whitespace a small model can emit newlines
# inside the object until max_tokens ends it.
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def json_schema_grammar(schema: dict | None, whitespace_pattern: str | None = None) -> str:
    """The grammar of JSON text matching `schema` (None: any JSON object, OpenAI's json_object
    mode), in JSON_LAYOUT unless `whitespace_pattern` (a regex) says what whitespace may separate
    tokens. Raises InvalidRequest with llguidance's reason when the schema cannot be compiled."""
    layout = JSON_LAYOUT if whitespace_pattern is None else {"whitespace_flexible": True,
                                                             "whitespace_pattern": whitespace_pattern}
    try:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(
            {"type": "object"} if schema is None else schema, defaults=layout)
    except (ValueError, TypeError) as exc:
        raise InvalidRequest(f"invalid JSON schema: {exc}") from None
    return _checked(grammar, "JSON schema")


def text_grammar(kind: str, source: str | list[str]) -> str:
    """The grammar of a regular expression (kind "regex"), of exactly one of a list of strings
    ("choice"), or of a context-free grammar in Lark or llama.cpp's GBNF syntax ("grammar"). Raises
    InvalidRequest with llguidance's reason when it cannot be compiled."""
    try:
        grammar = llguidance.grammar_from(kind, source)
    except (ValueError, TypeError) as exc:
        raise InvalidRequest(f"invalid {kind}: {exc}") from None
    return _checked(grammar, kind)


def _checked(grammar: str, what: str) -> str:
    error = llguidance.LLMatcher.validate_grammar(grammar)
    if error:
        raise InvalidRequest(f"invalid {what}: {error}")
    return grammar


def grammar_tokenizer(tokenizer, vocab_size: int) -> llguidance.LLTokenizer:
    """llguidance's view of a helios Tokenizer (its HF `tokenizers` model and EOS). Building it
    takes about 0.3 s for SmolLM2, so a core builds it once (TorchCore.prepare_grammars)."""
    return llguidance.LLTokenizer(tokenizer.hf_json(), n_vocab=vocab_size, eos_token=tokenizer.eos_id)


class CompiledGrammar:
    """A grammar already compiled into a matcher for one tokenizer, off the engine's thread (the
    server does this before admission): a Constraint built from it copies the matcher instead of
    compiling again, so a large grammar never stalls the frames of other requests."""

    __slots__ = ("grammar", "_matcher")

    def __init__(self, lltokenizer: llguidance.LLTokenizer, grammar: str, limits=None):
        self.grammar = grammar
        self._matcher = llguidance.LLMatcher(lltokenizer, grammar, log_level=0, limits=limits)
        if self._matcher.is_error():
            raise InvalidRequest(f"the grammar does not compile: {short_reason(self._matcher.get_error())}")

    def matcher(self) -> llguidance.LLMatcher:
        """A fresh matcher at the grammar's start (a copy; the compiled one is never advanced)."""
        return self._matcher.deep_copy()


def short_reason(error: str | None) -> str:
    """llguidance's error without the parser state it appends (which may quote the grammar)."""
    return (error or "the grammar matcher failed").splitlines()[0][:200]


class Constraint:
    """One request's grammar state: `mask` the logits of its next position, `consume` what it
    committed. A matcher that fails at run time (a parser limit reached mid-output) sets `error`
    instead of raising, so that only its own row ends (Execution.row_errors) and the rest of the
    frame completes."""

    def __init__(self, lltokenizer: llguidance.LLTokenizer, grammar: "str | CompiledGrammar"):
        if isinstance(grammar, CompiledGrammar):
            self.matcher = grammar.matcher()
        elif isinstance(grammar, str):
            # The matcher compiles and checks the grammar; it reports a bad one rather than raising.
            self.matcher = llguidance.LLMatcher(lltokenizer, grammar)
        else:
            raise InvalidRequest(f"the {GRAMMAR_OPTION} option must be a serialized grammar string")
        if self.matcher.is_error():
            raise InvalidRequest(f"the {GRAMMAR_OPTION} option is not a valid serialized grammar: "
                                 f"{short_reason(self.matcher.get_error())}")
        self.error: str | None = None

    def mask(self, logits: torch.Tensor) -> None:
        """Set the logits [V] of every token the grammar does not allow here to -inf, in place."""
        if self.error is not None:
            return
        # One bit per token id, lowest bit first (little-endian int32 words).
        bits = np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8)
        if self.matcher.is_error():  # the row's sample is discarded: its request ends with the error
            self._fail()
            return
        allowed = np.unpackbits(bits, bitorder="little")[: logits.shape[-1]]
        logits.masked_fill_(torch.from_numpy(allowed == 0).to(logits.device), float("-inf"))

    def consume(self, tokens: Sequence[int]) -> None:
        for t in tokens:
            if self.error is not None or self.matcher.is_stopped():
                return  # failed, or complete: the mask allowed only EOS, which ends the request
            if not self.matcher.consume_token(t):
                # A parser limit reached on this token (a masked sample is otherwise always allowed).
                self._fail()
                return

    def _fail(self) -> None:
        self.error = short_reason(self.matcher.get_error())


def row_errors(works) -> dict | None:
    """Execution.row_errors: by handle, the reason each constrained row of a frame failed."""
    failed = {w.request.handle: w.request.constraint.error for w in works
              if w.request.constraint is not None and w.request.constraint.error is not None}
    return failed or None

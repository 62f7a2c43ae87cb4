"""Budgets on output constraints, checked before anything is compiled, and the compile itself
under a time budget, off the event loop and off the engine's thread (issue 42).

A constraint that llguidance compiles but cannot run (more alternatives in one place than its
2,000 Earley items per row, a `$ref` that refers only to itself) used to fail at its first token
with a 500, and took the requests batched with it down too; one with 70k choices built its
matcher on the engine's thread and stalled every stream for half a minute. Here every constraint
is refused with a 400 naming its field before admission when:
- its source is over a size budget: choices, bytes of text, JSON depth, nodes, or branches of one
  `anyOf`/`oneOf`/`allOf`/`enum` (LIMITS below);
- llguidance refuses it, or its compile or matcher build takes longer than the time budget;
- its matcher fails on a short probe: the first mask and the first few tokens it allows.
The client gets llguidance's first line only; the grammar and the parser state go to the log.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import logging
from dataclasses import dataclass

import numpy as np

from helios.engine.grammar import GRAMMAR_OPTION, CompiledGrammar, json_schema_grammar, short_reason
from helios.errors import InvalidRequest
from helios.server.constraint_paths import deepest_failing
from helios.server.errors import APIError

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ConstraintLimits:
    """Size and time budgets for one request's output constraint."""

    max_choices: int = 1000  # llguidance allows 2,000 Earley items per row; a choice list takes one per label
    max_text_bytes: int = 64 * 1024  # a regex, grammar, or all choices together
    max_depth: int = 32  # JSON nesting of a schema
    max_nodes: int = 20_000  # JSON values in a schema
    max_branches: int = 1000  # entries of one anyOf / oneOf / allOf / enum / prefixItems
    compile_s: float = 5.0  # wall time to compile the grammar and build its matcher
    probe_tokens: int = 8  # tokens the probe walks after the first mask

    def __post_init__(self):
        for field in dataclasses.fields(self):
            if not getattr(self, field.name) > 0:
                raise ValueError(f"ConstraintLimits.{field.name} must be positive")


LIMITS = ConstraintLimits()
_BRANCHES = ("anyOf", "oneOf", "allOf", "enum", "prefixItems")
# Compiles run here, so a compile past its budget is abandoned without holding a request thread.
_COMPILER = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="flare-grammar")


def check_source(kind: str, source, param: str, limits: ConstraintLimits = LIMITS) -> None:
    """A 400 naming `param` when a constraint's source is over a size budget."""
    if kind == "choice":
        if len(source) > limits.max_choices:
            _refuse(param, f"{len(source)} choices; the limit is {limits.max_choices}")
        size = sum(len(c.encode("utf-8", "surrogatepass")) for c in source)
    elif kind == "json":
        check_json(source, param, limits)
        return
    else:
        size = len(source.encode("utf-8", "surrogatepass")) if isinstance(source, str) else 0
    if size > limits.max_text_bytes:
        _refuse(param, f"{size} bytes of {kind} text; the limit is {limits.max_text_bytes}")


def check_json(value, param: str, limits: ConstraintLimits = LIMITS) -> None:
    """Depth, node and branch budgets of a JSON schema, walked without recursion (a schema
    nested thousands deep must not raise RecursionError here or in the compiler)."""
    stack, nodes = [(value, 1)], 0
    while stack:
        node, depth = stack.pop()
        nodes += 1
        if depth > limits.max_depth:
            _refuse(param, f"the schema is nested more than {limits.max_depth} deep")
        if nodes > limits.max_nodes:
            _refuse(param, f"the schema has more than {limits.max_nodes} values")
        if isinstance(node, dict):
            for key in _BRANCHES:
                if isinstance(node.get(key), list) and len(node[key]) > limits.max_branches:
                    _refuse(param, f"{key} has {len(node[key])} entries; the limit is {limits.max_branches}")
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)


def timed(fn, *args, param: str, limits: ConstraintLimits = LIMITS):
    """fn(*args) on the compiler threads; a 400 naming `param` past the compile budget."""
    future = _COMPILER.submit(fn, *args)
    try:
        return future.result(timeout=limits.compile_s)
    except concurrent.futures.TimeoutError:
        log.warning("constraint %s: compile abandoned after %.1f s", param, limits.compile_s)
        _refuse(param, f"it did not compile within {limits.compile_s:g} s")


def compile_for_core(prepared, core, param: str | None, limits: ConstraintLimits = LIMITS,
                     source: tuple[str, dict | None] | None = None):
    """`prepared` with its grammar compiled into a matcher for `core`'s tokenizer and probed, so
    that the core attaches it without compiling (helios.engine.grammar.CompiledGrammar). A 400
    for a grammar the matcher refuses or fails on within the probe, naming `param`, or with
    `source` (structured_outputs.constraint_source) the field path of the constraint and, for a
    JSON schema the probe refuses, of its deepest subschema that fails alone."""
    grammar = next((c.params.core_options.get(GRAMMAR_OPTION) for c in prepared.choices
                    if GRAMMAR_OPTION in c.params.core_options), None)
    if grammar is None or not isinstance(grammar, str):
        return prepared
    lltokenizer = core.prepare_grammars()
    field = param if source is None else source[0]
    try:
        compiled = timed(_checked, lltokenizer, grammar, limits.probe_tokens, param=field, limits=limits)
    except InvalidRequest as exc:
        path = field if source is None else _failing_path(lltokenizer, *source, limits)
        log.info("constraint %s refused: %s", path, exc)
        _refuse(path, str(exc))
    choices = tuple(dataclasses.replace(c, params=dataclasses.replace(
        c.params, core_options={**c.params.core_options, GRAMMAR_OPTION: compiled})) for c in prepared.choices)
    return dataclasses.replace(prepared, choices=choices)


def _failing_path(lltokenizer, path: str, schema: dict | None, limits: ConstraintLimits) -> str:
    # The deepest subschema that fails the same compile and probe alone, within the compile budget
    # (past it, the constraint's own field path).
    if schema is None:
        return path

    def fails(sub: dict) -> bool:
        try:
            _checked(lltokenizer, json_schema_grammar(sub), limits.probe_tokens)
        except InvalidRequest:
            return True
        return False
    future = _COMPILER.submit(deepest_failing, schema, path, fails)
    try:
        return future.result(timeout=limits.compile_s)
    except concurrent.futures.TimeoutError:
        return path


@functools.lru_cache(maxsize=256)
def _checked(lltokenizer, grammar: str, probe_tokens: int) -> CompiledGrammar:
    # One compile and probe per distinct grammar (clients resend theirs with every request).
    compiled = CompiledGrammar(lltokenizer, grammar)
    _probe(compiled, lltokenizer.vocab_size, probe_tokens)
    return compiled


def _probe(compiled: CompiledGrammar, vocab_size: int, steps: int) -> None:
    # Walk a few tokens the grammar allows (the lowest-numbered each time): parser limits such as
    # the items per row show up at the first masks and tokens, where a run would fail.
    matcher = compiled.matcher()
    for _ in range(steps + 1):
        bits = np.frombuffer(matcher.compute_bitmask(), dtype=np.uint8)
        if matcher.is_error():
            break
        if matcher.is_stopped():
            return
        allowed = np.flatnonzero(np.unpackbits(bits, bitorder="little")[:vocab_size])
        if len(allowed) == 0:
            raise InvalidRequest("the grammar allows no token at all")
        if not matcher.consume_token(int(allowed[0])):
            break
    if matcher.is_error():
        log.info("constraint probe failed: %s", matcher.get_error())
        raise InvalidRequest(f"the grammar cannot be followed: {short_reason(matcher.get_error())}")


def _refuse(param: str, reason: str):
    raise APIError(400, f"{param}: {reason}", param=param, code="invalid_value")

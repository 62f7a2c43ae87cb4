"""Shared builders of the mixed-graph tests: shapes, measured catalogs, hand-set populations."""

from __future__ import annotations

from helios.graphs import GraphKind, GraphShape

from conftest import MS, decode, prefill, spec


def mixed(b, c, w=1, rows=1):
    """A mixed graph; `rows` prompt rows share its prompt capacity (docs/packed-prompt-rows.md)."""
    return GraphShape(GraphKind.MIXED, b, w, w - 1, 0, c, rows)


def small_mixed_catalog():
    """A measured synthetic catalog: a mixed graph costs its prompt chunk plus a little per row."""
    table = {}
    for b in (1, 2, 4, 8):
        table[decode(b)] = 6.0 + 0.1 * b
    for c in (64, 256, 1024):
        table[prefill(c)] = 6.0 + 0.02 * c
        for b in (2, 4, 8):
            table[mixed(b, c)] = 6.0 + 0.02 * c + 0.1 * b
    return table


def decoders_and_prompts(s, decoders=2, prompts=(), out=50, age_ms=20):
    """Admit `decoders` requests already decoding (prompt consumed, a publication `age_ms` ago)
    and one prefilling request per entry of `prompts` (tokens left); returns both handle lists."""
    now = s.now_ns
    dec, pro = [], []
    for _ in range(decoders):
        h = s.admit(spec(prompt=64, out=out), now)
        t, r = s.requests, s.requests.row(h)
        t.prompt_done[r] = t.prompt_tokens[r]
        t.last_publication_ns[r], t.has_publication[r] = now - age_ms * MS, True
        t.update_phase([r])
        dec.append(h)
    for left in prompts:
        pro.append(s.admit(spec(prompt=left, out=out), now))
    return dec, pro

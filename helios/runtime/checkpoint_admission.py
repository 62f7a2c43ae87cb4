"""Admission against the checkpoint store: which stored anchor a new request restores.

A request that extends a stored state (a chat turn extending a stored conversation, or any prompt
sharing a stored prefix) restores the longest stored prefix instead of re-prefilling it: K/V at a
position depends only on the tokens up to it, so any shared prefix restores exactly. The match is taken before the
scheduler admits the request, so its `cached_tokens` name the exact restored endpoint, and the
match guards its entry from eviction until the core restored it or detached the request.
"""

from __future__ import annotations

from typing import Sequence


def checkpoint_match(scheduler, core, prompt: Sequence[int]):
    """(match, store), or (None, None) when the request restores nothing: no store on the core,
    a scheduler that does not plan restores, or no stored prefix."""
    store = getattr(core, "checkpoints", None)
    if store is None or not scheduler.restores_checkpoints():
        return None, None
    match = store.match(prompt)
    return (match, store) if match is not None else (None, None)

"""Copy proposals (prompt lookup): drafts copied from the request's own context.

The longest suffix n-gram of the context (n from `max_ngram` down to `min_ngram`) is looked up
earlier in the context; the tokens that followed its most recent earlier occurrence are the
drafts. Proposals are deterministic, draw no random numbers and cost no model work, so for the
scheduler's accounting they are copy proposals: D bounds the supplied prefix.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


def copy_proposals(context: Sequence[int], max_drafts: int, max_ngram: int = 3,
                   min_ngram: int = 1) -> list[int]:
    """Up to `max_drafts` tokens predicted to follow `context` (its last token included).

    Returns fewer (possibly none) when no suffix n-gram recurs or the match lies near the end.
    """
    if max_drafts <= 0 or len(context) < 2 or min_ngram < 1:
        return []
    ctx = np.asarray(context, dtype=np.int64)
    n_total = len(ctx)
    for n in range(min(max_ngram, n_total - 1), min_ngram - 1, -1):
        suffix = ctx[n_total - n:]
        # Windows that start at j and end before the final token (j + n <= n_total - 1), so a
        # match is a strictly earlier occurrence that has at least one following token.
        windows = np.lib.stride_tricks.sliding_window_view(ctx[: n_total - 1], n)
        hits = np.flatnonzero((windows == suffix).all(axis=1))
        if len(hits):
            j = int(hits[-1]) + n  # most recent occurrence: recent repetition predicts best
            return ctx[j: j + max_drafts].tolist()
    return []

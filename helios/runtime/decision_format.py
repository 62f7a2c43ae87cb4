"""One recorded decision as a plain dict: what ran, for whom, why, and what it beat.

Runs only when someone reads the decision log (helios.runtime.decisions). Values are in the
decision's own scale: every value and rate of one decision shares the positive factor
exp(-log_scale) (the spec's shared scaling), so they compare within a decision; `value_rate_log10`
is log10 of the unscaled rate, which compares across decisions.

Field meanings (docs/server.md, "Decision log"):
- reason: ordinary | discovery (unknown duration) | timing_refresh (funded) | acceptance_probe
  (funded) | prerequisite (restore, vision, a window snapshot) | retirement (terminal snapshot) |
  checkpoint (an anchor snapshot);
- alternatives: the best evaluated candidates of other graphs, best first (the first is the best
  rejected alternative; under a refresh or probe it is the ordinary winner);
- prices: the highest-priced decoding streams (the value of their next token: token and delivery
  prices plus the output-age credit) and waiting prompts (the price of one prompt token).
"""

from __future__ import annotations

import math

from helios.graphs import GraphKind

TOP_PRICES = 5
TOP_ALTERNATIVES = 3
_LOG10 = math.log(10.0)
_PROMPT_KINDS = (GraphKind.PREFILL, GraphKind.SCORED_PREFILL)
_PREREQUISITES = (GraphKind.RESTORE, GraphKind.VISION)


def reason_of(plan) -> str:
    kind = plan.shape.kind
    if kind in _PREREQUISITES or (kind is GraphKind.SNAPSHOT and plan.private_state):
        return "prerequisite"
    if kind is GraphKind.SNAPSHOT:
        return "checkpoint" if plan.anchor else "retirement"
    reason = plan.reason.value
    return "acceptance_probe" if reason == "acceptance_learning" else reason


def _log10_rate(score: float, log_scale: float) -> float | None:
    return math.log10(score) + log_scale / _LOG10 if score > 0 and math.isfinite(score) else None


def _finite(x) -> float | None:
    x = float(x)
    return x if math.isfinite(x) else None


def _request(handle: int, names: dict) -> dict:
    rid, cls = names.get(handle, (None, None))
    out = {"handle": handle, "id": rid}
    if cls is not None:
        out["class"] = cls
    return out


def served_handles(c, view) -> list[int] | None:
    """The requests a candidate would serve, or None where its rows index the request table (state
    and window candidates), which has moved on since the decision."""
    if getattr(c, "table_rows", None) is not None:
        return None
    kind = c.shape.kind
    members = c.members.tolist()
    if kind is GraphKind.MIXED:
        handles = view.decode.handles
        out = [int(handles[i]) for i in members]
        prompt = getattr(c, "prompt", None)
        if prompt is not None and GraphKind.PREFILL in view.prefill:
            out.insert(0, int(view.prefill[GraphKind.PREFILL][0].handles[prompt]))
        return out
    if kind in (GraphKind.DECODE, GraphKind.SPECULATIVE):
        pool = view.decode
    elif kind in _PROMPT_KINDS and kind in view.prefill:
        pool = view.prefill[kind][0]
    else:
        return None
    return [int(pool.handles[i]) for i in members]


def _alternative(c, view, log_scale: float, names: dict) -> dict:
    handles = served_handles(c, view)
    return {"graph": c.shape.label(), "kind": c.shape.kind.value, "value_rate": _finite(c.score),
            "value_rate_log10": _log10_rate(c.score, log_scale),
            "estimated_ms": None if c.t_ms is None else float(c.t_ms), "cohort_size": len(c.members),
            "cohort": None if handles is None else [_request(h, names) for h in handles]}


def alternatives(view, candidates, chosen, log_scale: float, names: dict, top: int = TOP_ALTERNATIVES) -> list[dict]:
    """The best candidate of each other graph, best first (the selection's own key order)."""
    seen, out = {chosen.shape} if chosen is not None else set(), []
    for c in sorted(candidates, key=lambda c: c.key, reverse=True):
        if c is chosen or c.shape in seen:
            continue
        seen.add(c.shape)
        out.append(_alternative(c, view, log_scale, names))
        if len(out) == top:
            break
    return out


def _top(handles, values, names: dict, top: int) -> list[dict]:
    order = sorted(range(len(values)), key=lambda i: -values[i])[:top]
    return [{**_request(int(handles[i]), names), "price": _finite(values[i])} for i in order]


def prices(view, names: dict, top: int = TOP_PRICES) -> dict:
    """The highest prices among decoding streams and waiting prompts, and how many of each."""
    decode = view.decode
    waiting_h, waiting_p = [], []
    for pool, _ in view.prefill.values():
        waiting_h += pool.handles.tolist()
        waiting_p += [math.exp(v) for v in pool.log_prefill.tolist()]
    return {"decoding": _top(decode.handles.tolist(), decode.base.tolist(), names, top),
            "waiting": _top(waiting_h, waiting_p, names, top),
            "decoding_count": len(decode.handles), "waiting_count": len(waiting_h)}


def describe(fence: int, t: float, plan, detail, names: dict, top_prices: int = TOP_PRICES,
             top_alternatives: int = TOP_ALTERNATIVES) -> dict:
    """A recorded decision as a JSON-ready dict (`detail`: (view, candidates, chosen) or None)."""
    lanes = plan.lanes
    cohort = []
    for h, p, rows, tokens, value in zip(lanes.handle.tolist(), lanes.prompt_tokens.tolist(),
                                         lanes.output_rows.tolist(), lanes.expected_tokens.tolist(),
                                         lanes.value.tolist()):
        cohort.append({**_request(h, names), "prompt_tokens": p, "output_rows": rows,
                       "expected_tokens": tokens, "value": _finite(value)})
    est = plan.estimated_duration_ns
    out = {"seq": fence, "t": t, "graph": plan.shape.label(), "kind": plan.shape.kind.value,
           "cohort": cohort, "estimated_ms": None if est is None else est / 1e6, "measured_ms": None,
           "value_rate": _finite(plan.score), "log_scale": plan.log_scale,
           "value_rate_log10": _log10_rate(plan.score, plan.log_scale),
           "reason": reason_of(plan), "execution_class": plan.reason.value,
           "alternatives": [], "candidates": None, "prices": None}
    if detail is not None:
        view, candidates, chosen = detail
        out["alternatives"] = alternatives(view, candidates, chosen, plan.log_scale, names, top_alternatives)
        out["candidates"] = len(candidates)
        out["prices"] = prices(view, names, top_prices)
    return out

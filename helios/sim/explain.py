"""`flare sim explain RUN`: why a request waited, from a run's decision log (helios.sim.decision_run).

--request H: the decisions from H's arrival to its first output (or, with --at T, the wait that
contains T: before its first output or between two of its outputs): how often H was a candidate,
what ran instead (graphs, time, cohorts), H's price rank among the waiting or decoding requests,
and the best graph that would have served H with its value rate against the winner's.
--at T alone: the decision in force at T, its alternatives and prices.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path


def load_run(run: str | Path) -> tuple[dict, dict[int, dict], list[dict]]:
    run = Path(run)
    if not (run / "decisions.jsonl").is_file():
        raise FileNotFoundError(f"{run} holds no decisions.jsonl (write one with `flare sim run --out {run}`)")
    meta = json.loads((run / "run.json").read_text())
    requests = {r["handle"]: r for r in map(json.loads, (run / "requests.jsonl").read_text().splitlines())}
    decisions = [json.loads(line) for line in (run / "decisions.jsonl").read_text().splitlines()]
    return meta, requests, decisions


def _ms(x) -> str:
    return "unknown" if x is None else f"{x:.1f} ms"


def _rate(x) -> str:
    return "n/a" if x is None else f"{x:.4g}"


def _in(d: dict, h: int) -> bool:
    return any(r["handle"] == h for r in d["cohort"])


def _rank(d: dict, h: int) -> tuple[str, int, int] | None:
    """('waiting' | 'decoding', 1-based rank, count) of h among the decision's priced requests."""
    p = d.get("prices")
    if not p:
        return None
    for group in ("waiting", "decoding"):
        for i, r in enumerate(p[group]):
            if r["handle"] == h:
                return group, i + 1, p[f"{group}_count"]
    return None


def _best_serving(d: dict, h: int) -> dict | None:
    for a in d["alternatives"]:
        if a["cohort"] and any(r["handle"] == h for r in a["cohort"]):
            return a
    return None


def wait_window(req: dict, at: float | None) -> tuple[float, float, str]:
    """(start, end, what) of the wait to explain: before the first output, or the gap holding `at`."""
    pubs = req["publications_s"]
    end_of_run = req["finished_s"] if req["finished_s"] is not None else float("inf")
    if at is None or not pubs or at < pubs[0]:
        return req["arrival_s"], pubs[0] if pubs else end_of_run, "its first output"
    for before, after in zip(pubs, pubs[1:]):
        if before <= at < after:
            return before, after, "its next output"
    return pubs[-1], end_of_run, "the end of its stream"


def explain_request(meta: dict, requests: dict, decisions: list[dict], h: int, at: float | None = None) -> str:
    if h not in requests:
        raise KeyError(f"no request {h} in this run (handles 0..{len(requests) - 1})")
    req = requests[h]
    start, end, what = wait_window(req, at)
    during = [d for d in decisions if start <= d["t"] < end]
    lines = [f"request {h} ({req['client']}, {req['prompt_tokens']} prompt tokens): arrived at {req['arrival_s']:.3f} s;"
             f" waited {end - start:.3f} s from {start:.3f} s for {what} (at {end:.3f} s).",
             f"{len(during)} decisions in that time ({meta['scheduler']}, {meta['trace']} at load {meta['load']})."]
    served = [d for d in during if _in(d, h)]
    others = [d for d in during if not _in(d, h)]
    if served:
        lines.append(f"It was served {len(served)} times: " + ", ".join(
            f"{d['graph']} at {d['t']:.3f} s" for d in served[:6]) + (" …" if len(served) > 6 else ""))
    candidate = [d for d in others if _rank(d, h) is not None]
    absent = len(others) - len(candidate)
    if absent:
        lines.append(f"In {absent} of the other decisions it was not a candidate: no request slot or KV pages were "
                     f"free for it, or its previous chunk was still queued.")
    if others:
        by_graph = Counter(d["graph"] for d in others)
        busy = sum((d["measured_ms"] or d["estimated_ms"] or 0.0) for d in others)
        lines.append(f"What ran instead ({busy / 1e3:.3f} s of graphs): " + ", ".join(
            f"{g} x{n}" for g, n in by_graph.most_common(6)))
    if candidate:
        ranks = [_rank(d, h) for d in candidate]
        group = Counter(r[0] for r in ranks).most_common(1)[0][0]
        mean_rank = sum(r[1] for r in ranks) / len(ranks)
        lines.append(f"While it was a candidate ({len(candidate)} decisions) it was {group}, with price rank "
                     f"{mean_rank:.1f} on average among {max(r[2] for r in ranks)} (1 = highest price).")
        lines.append("Decisions while it was a candidate (value rates share one scale within a decision):")
        lines.append(f"  {'t (s)':>9}  {'ran':<26} {'rate':>10} {'its rank':>9}  best graph serving it (rate, vs winner)")
        for d in candidate[:12]:
            r, alt = _rank(d, h), _best_serving(d, h)
            alt_text = "none evaluated (pruned or not feasible)" if alt is None else (
                f"{alt['graph']} ({_rate(alt['value_rate'])}, "
                f"{alt['value_rate'] / d['value_rate']:.2f}x)" if alt["value_rate"] and d["value_rate"] else alt["graph"])
            lines.append(f"  {d['t']:>9.3f}  {d['graph']:<26} {_rate(d['value_rate']):>10} {r[1]:>5}/{r[2]:<3}  {alt_text}")
        if len(candidate) > 12:
            lines.append(f"  … {len(candidate) - 12} more")
    return "\n".join(lines)


def explain_at(decisions: list[dict], at: float) -> str:
    before = [d for d in decisions if d["t"] <= at]
    if not before:
        return f"no decision at or before {at:.3f} s"
    d = before[-1]
    lines = [f"decision #{d['seq']} at {d['t']:.3f} s: {d['graph']} ({d['reason']}), estimated {_ms(d['estimated_ms'])}, "
             f"measured {_ms(d['measured_ms'])}, value rate {_rate(d['value_rate'])}",
             "  cohort: " + ", ".join(str(r["handle"]) for r in d["cohort"])]
    for a in d["alternatives"]:
        lines.append(f"  rejected {a['graph']}: rate {_rate(a['value_rate'])}, {a['cohort_size']} requests, "
                     f"estimated {_ms(a['estimated_ms'])}")
    if d.get("prices"):
        for group in ("waiting", "decoding"):
            top = d["prices"][group][:5]
            if top:
                lines.append(f"  top {group} prices: " + ", ".join(f"{r['handle']}={_rate(r['price'])}" for r in top))
    return "\n".join(lines)


def explain(run: str | Path, request: int | None = None, at: float | None = None) -> str:
    meta, requests, decisions = load_run(run)
    if request is not None:
        return explain_request(meta, requests, decisions, request, at)
    if at is not None:
        return explain_at(decisions, at)
    waits = sorted(((r["first_output_s"] or r["arrival_s"]) - r["arrival_s"], h) for h, r in requests.items())
    longest = ", ".join(f"{h} ({w:.3f} s)" for w, h in waits[::-1][:5])
    return f"{len(requests)} requests, {len(decisions)} decisions; the longest waits for a first output: {longest}"

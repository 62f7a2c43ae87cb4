"""The Markdown text of the simulator report (helios.sim.report runs the experiments)."""

from __future__ import annotations

import math
import os

from helios.graphs import GraphKind
from helios.sim.experiment import REUSE_SUFFIX, load_cost_model
from helios.sim.workload import LOAD_FACTOR, loads_of, trace_label

COLUMNS = ("scheduler", "rate (req/s)", "output tok/s", "total tok/s", "TTFT p50 (ms)", "TTFT p99 (ms)",
           "gap p50 (ms)", "gap p99 (ms)", "e2e p50 (s)", "e2e p99 (s)", "SLO attained", "Jain")


def _num(x, digits: int = 0) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    return f"{x:,.{digits}f}"


def _table(header, rows) -> list[str]:
    rule = "|" + "|".join("---" if i == 0 else "---:" for i in range(len(header))) + "|"  # numbers align right
    lines = ["| " + " | ".join(header) + " |", rule]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return lines + [""]


def _row(name: str, r: dict) -> list[str]:
    m = r["metrics"]
    return [name, _num(m["offered_rate"], 2), _num(m["output_tok_s"]), _num(m["total_tok_s"]),
            _num(m["ttft_p50_ms"]), _num(m["ttft_p99_ms"]), _num(m["gap_p50_ms"]), _num(m["gap_p99_ms"]),
            _num(_s(m["e2e_p50_ms"]), 1), _num(_s(m["e2e_p99_ms"]), 1), _spread(r, "slo_attainment"),
            _num(m["jain"], 3)]


def _s(ms):
    return None if ms is None else ms / 1e3


def _goodput(g) -> str:
    """Mean over seeds, with the range when the seeds differ."""
    if g.status == "below" and g.high == 0:
        return "0 (fails at the lowest rate)"
    text = f"{g.goodput:.2f}"
    if g.high > g.low:
        text += f" [{g.low:.2f}-{g.high:.2f}]"
    return f">= {text} (passes every rate tried)" if g.status == "at-least" else text


def _spread(r: dict, key: str, digits: int = 2) -> str:
    """A metric's seed mean with its [min-max] range (when there is one)."""
    m, rng = r["metrics"][key], r.get("range", {}).get(key)
    text = _num(m, digits)
    if rng is not None and rng[1] > rng[0]:
        text += f" [{_num(rng[0], digits)}-{_num(rng[1], digits)}]"
    return text


def _setup_lines(cfg) -> list[str]:
    s = cfg.setup
    catalog = s.catalog()
    decode = sorted(x.batch_capacity for x in catalog.of_kind(GraphKind.DECODE))
    prefill = catalog.of_kind(GraphKind.PREFILL)
    mixed_ladder = sorted({x.prefill_capacity for x in s.catalog(mixed=True).of_kind(GraphKind.MIXED)
                           if x.token_capacity == 1})
    cm = load_cost_model(s.cost_model)
    overhead = getattr(cm, "overhead_ms", None)
    profile = getattr(cm, "profile", None)
    return [
        f"- **Cost model** `{s.cost_model}` (docs/cost-models.md)"
        + (f", {profile.layers} layers, tensor parallelism {profile.tp}" if profile is not None else "")
        + (f", per-graph overhead {overhead:.2f} ms" if overhead is not None else "") + f"; SimCore timing noise "
        f"{s.noise:.0%} (multiplicative, seeded).",
        f"- **Catalog** {len(catalog)} graphs: decode at batch {', '.join(map(str, decode))}; {len(prefill)} prefill "
        f"graphs (B x C) with C in {', '.join(map(str, s.chunks))} and B x C <= {max(s.chunks)}.",
        f"- **Resources** {s.request_slots} request slots, {s.config().kv_pages} KV pages of {s.page_tokens} tokens "
        f"(every slot at its full {s.max_context}-token context, so page reservation never binds).",
        "- **Mixed graphs** " + ("on for the Helios schedulers (`--mixed-prefill`: the mixed prefill+decode catalog "
                                 f"is added to theirs, prompt buckets {', '.join(map(str, mixed_ladder))}; longer "
                                 "chunks run in the prefill graphs; "
                                 + (f"up to {s.mixed_prompt_rows} prompt rows share a graph's prompt capacity, "
                                    if s.mixed_prompt_rows > 1 else "one prompt row per graph, ")
                                 + "a `[mixed_prompt_rows=N]` row sets N for itself: docs/packed-prompt-rows.md); "
                                 "the baselines keep their own rules."
                                 if s.mixed_prefill else
                                 "off: Helios runs separate prefill and decode graphs."),
        "- **Prefix reuse** " + ("rows added (`+reuse`) on the traces with block hashes: automatic prefix caching "
                                 "by 512-token block-hash chains for every scheduler alike, bounded by the same KV "
                                 "pool's free pages, LRU eviction (docs/simulator.md)." if cfg.prefix_reuse else
                                 "off: every prompt is prefilled in full."),
        "- **Warm-up** " + ("every graph measured once before the trace (off the clock), for every scheduler."
                            if s.warmup else "none: graphs are discovered during the trace."),
        f"- **Load factor** {', '.join(f'`{k}` x{v:g}' for k, v in LOAD_FACTOR.items())}: its loads and sweep "
        "points are multiplied by it (short prompts and lenient SLOs: it reaches contention only there).",
        f"- **Seeds** {', '.join(map(str, cfg.seeds))}: every (trace, scheduler) runs once per seed (SimCore's timing "
        "noise; `multi`'s arrivals are those of the first seed). Tables give the mean and, in brackets, the range "
        "over seeds. **Window**: " + (f"the first {cfg.window_s:g} s of each trace ({cfg.window_s / 4:g} s of `multi`)"
                                       if cfg.window_s is not None else
                                       f"the shortest start of each trace holding at least {cfg.min_requests:,} "
                                       "requests (see the workload table)")
        + ", compressed or stretched by the rate scale. Mooncake's arrivals, stamped on a 3-s tick, are spread "
        "evenly over their tick.",
        "- **Load** is nominal: device-seconds of work offered per second, each prompt prefilled alone and each "
        "output token at its share of a full decode batch. SLOs break well below load 1 (decode batches are "
        "rarely full, and prefill stalls decode).",
        f"- **Goodput sweep** over loads {', '.join(f'{x:g}' for x in cfg.sweep)}, stopping at the first that "
        f"fails (halving the load up to {cfg.extend_down} times when the first already fails), then bisection at "
        f"geometric midpoints until the passing and failing loads are within {cfg.resolution:.0%} (at most "
        f"{cfg.refine} steps); goodput is the offered rate (requests/s) of the highest passing run, per seed.",
    ]


def write_markdown(cfg, schedulers, skipped, results, workloads, figures, command: str, wall_s: float,
                   variants=()) -> str:
    mid = len(cfg.loads) // 2
    label = {t: trace_label(t) for t in cfg.traces}
    out = ["# Helios simulator report", "",
           f"Generated by: `{command or 'flare sim report'}`", "",
           f"Wall time: {wall_s:.0f} s with {cfg.jobs} worker(s) on a {os.cpu_count()}-CPU machine; "
           f"{sum(r['runs'] for r in results.values())} simulated runs.", "",
           f"Schedulers: {', '.join(schedulers) or 'none'}."]
    if skipped:
        out += ["", "Skipped (failed to construct): "
                + "; ".join(f"`{k}` ({v})" for k, v in skipped.items()) + "."]
    out += ["", "## Setup", ""] + _setup_lines(cfg) + ["", "### Workloads and SLOs", ""]
    rows = []
    for t, w in workloads.items():
        rows.append([label[t], str(w.requests), _num(w.window_s, 1), _num(w.base_rate, 2), _num(w.load_at_1, 2),
                     _num(w.slo.ttft_ms), _num(w.slo.gap_ms)])
    out += _table(("trace", "requests", "window (s)", "rate at scale 1 (req/s)", "nominal load at scale 1",
                   "TTFT SLO (ms)",
                   f"p{w.slo.gap_quantile * 100:g} gap SLO (ms)" if workloads else "gap SLO (ms)"), rows)
    out += [f"SLOs (docs/simulator.md): TTFT <= {cfg.ttft_slo_scale:g} x the solo prefill of the window's "
            f"90th-percentile prompt, and each request's p99 inter-delivery gap <= {cfg.gap_slo_scale:g} x a "
            "batch-1 decode at the median context; a request attains when it meets both. Goodput: the highest "
            "rate at which at least 90% attain.", ""]
    out += ["## Goodput", "", "Mean over seeds [min-max].", ""]
    rows = [[s] + [_goodput(results[(t, s)]["goodput"]) for t in cfg.traces] for s in schedulers]
    out += _table(["scheduler"] + [f"{label[t]} (req/s)" for t in cfg.traces], rows)
    if variants:
        out += _ablation(cfg, schedulers, variants, results, mid)
    out += _prefix_reuse(cfg, schedulers, results, mid)
    out += ["## Headline", "", "Each trace at its middle load; seed means [range].", ""]
    for t in cfg.traces:
        middle = loads_of(t, cfg.loads)[mid]
        rows = []
        for s in schedulers:
            r = results[(t, s)]["loads"][middle]
            rows.append([s, _num(r["metrics"]["output_tok_s"]), _spread(r, "ttft_p50_ms", 0),
                         _spread(r, "ttft_p99_ms", 0), _num(r["metrics"]["gap_p50_ms"]),
                         _spread(r, "gap_p99_ms", 0), _spread(r, "slo_attainment"),
                         _goodput(results[(t, s)]["goodput"])])
        out += [f"**{label[t]}**, load {middle:g} "
                f"({_num(results[(t, schedulers[0])]['loads'][middle]['metrics']['offered_rate'], 2)} req/s)"
                if schedulers else f"**{label[t]}**", ""]
        out += _table(("scheduler", "output tok/s", "TTFT p50 (ms)", "TTFT p99 (ms)", "gap p50 (ms)",
                       "gap p99 (ms)", "SLO attained", "goodput (req/s)"), rows)
    for t in cfg.traces:
        out += [f"## {label[t]}", ""]
        for load in loads_of(t, cfg.loads):
            scale = results[(t, schedulers[0])]["loads"][load]["scale"] if schedulers else math.nan
            out += [f"Load {load:g} (rate scale {scale:.3g}); seed means, attainment with its range:", ""]
            out += _table(COLUMNS, [_row(s, results[(t, s)]["loads"][load]) for s in schedulers])
        for name in figures.get(t, []):
            out += [f"![{name[:-4]}]({name})", ""]
    out += ["Jain: Jain's index over clients of each one's service rate (prompt + output tokens per second) "
            "during the time it had a request waiting for its first token; n/a for single-client traces. "
            "Full numbers: results.json.", ""]
    return "\n".join(out)


def _ablation(cfg, schedulers, variants, results, mid: int) -> list[str]:
    """Helios variants (PolicyConfig overrides on the balanced preset) against helios-balanced."""
    traces = [t for t in cfg.traces if t in cfg.ablation_traces]
    names = [s for s in schedulers if s == "helios-balanced"] + [v for v in variants if v != "helios-balanced"]
    out = ["## Ablation", "",
           "Helios balanced and its variants (the bracket names the PolicyConfig fields changed from the "
           "balanced preset; docs/scheduling-utility.md explains each). Goodput: seed mean [range]; the "
           "other columns at each trace's middle load, seed means.", ""]
    header = ["variant"]
    for t in traces:
        lt = trace_label(t)
        header += [f"{lt} goodput", f"{lt} TTFT p50", f"{lt} TTFT p99", f"{lt} gap p99", f"{lt} SLO"]
    rows = []
    for v in names:
        row = [f"`{v}`"]
        for t in traces:
            r = results.get((t, v))
            if r is None:
                row += ["n/a"] * 5
                continue
            m = r["loads"][loads_of(t, cfg.loads)[mid]]
            row += [_goodput(r["goodput"]), _num(m["metrics"]["ttft_p50_ms"]), _num(m["metrics"]["ttft_p99_ms"]),
                    _num(m["metrics"]["gap_p99_ms"]), _spread(m, "slo_attainment")]
        rows.append(row)
    return out + _table(header, rows)


def _prefix_reuse(cfg, schedulers, results, mid: int) -> list[str]:
    """Each scheduler without and with automatic prefix reuse, on the traces that have reuse rows."""
    traces = [t for t in cfg.traces if any((t, s + REUSE_SUFFIX) in results for s in schedulers)]
    if not traces:
        return []
    out = ["## Prefix reuse", "",
           "Every scheduler without and with automatic prefix caching by the trace's 512-token block hashes "
           "(the same cache rule and the same KV pool for all; docs/simulator.md). Goodput: seed mean [range]; "
           "TTFT p50 and the prompt tokens a hit saved at the middle load, seed means.", ""]
    for t in traces:
        load = loads_of(t, cfg.loads)[mid]
        rows = []
        for s in schedulers:
            off, on = results.get((t, s)), results.get((t, s + REUSE_SUFFIX))
            if off is None or on is None:
                continue
            a, b = off["loads"][load]["metrics"], on["loads"][load]["metrics"]
            rows.append([s, _goodput(off["goodput"]), _goodput(on["goodput"]), _num(a["ttft_p50_ms"]),
                         _num(b["ttft_p50_ms"]), _spread(off["loads"][load], "slo_attainment"),
                         _spread(on["loads"][load], "slo_attainment"), f"{b.get('prefill_saved') or 0:.1%}"])
        out += [f"**{trace_label(t)}**, load {load:g}", ""]
        out += _table(("scheduler", "goodput off (req/s)", "goodput reuse (req/s)", "TTFT p50 off (ms)",
                       "TTFT p50 reuse (ms)", "SLO off", "SLO reuse", "prompt tokens saved"), rows)
    return out

"""Mixed prefill/generation candidates and lanes (spec: "Mixed execution contract").

A mixed graph (B, W, C) runs at most R = shape.prompt_rows prompt rows (one in the spec's form)
sharing C prompt tokens as one packed budget, and decode rows of width W, in one forward. For each
shape, selection compares cohorts at the same full graph duration:

  decode-only   the top-B decoders by lane value
  k prompt rows the first k rows of the shape's prompt fill plus the top B - k decoders, for every
                k = 1..R; with no decoders this is a prompt-only population, also legal

The prompt fill packs the budget in value order (docs/packed-prompt-rows.md): its first row is the
best prompt row (work min(prompt_left, C): a tail may fit), each next one the best remaining row
for the budget the rows before it left (work min(prompt_left, what is left)), until R rows or the
budget are used up. With R = 1 this is the spec's single best prompt row.

Lane values are additive and the duration does not depend on membership, so each cohort is exact
for its shape: the prompt row and the decoders come from disjoint pools (a request is either
prefilling or decoding). Padding earns nothing: a lane's value is its own expected service.
Decoders of a wider (speculative) graph keep their complete prefix min(D + 1, W, limit): mixed
decode rows are rectangular, P = B x W, so the row budget never constrains them.

Dominance pruning among mixed candidates requires the same decode cohort and prefixes, the same
prompt rows and the same logical prompt work (and, as for speculative rounds, the same depth).

Lanes: the prompt rows first, in fill order (ScheduledPlan.prefill_rows == (0, ..., k - 1)), as
`prefill_lanes` builds them, then
the decode rows as `decode_lanes` (W = 1) or `speculative_lanes` (W > 1) build them.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from operator import neg

import numpy as np

from helios.graphs import GraphKind
from helios.scheduler.cost import CostState
from helios.scheduler.lanes import decode_lanes, prefill_lanes, speculative_lanes
from helios.scheduler.plan import PlanLanes
from helios.scheduler.policy import Budget, Candidate, LanePool
from helios.scheduler.rounds import _ceilings, _gains
from helios.scheduler.memo import Memo, by_identity
from helios.scheduler.utility import ranked_lanes, rate_score, served_cost, stall_growth


@dataclass(slots=True)
class MixedCandidate(Candidate):
    """A Candidate whose `members` index the decode pool; the prompt rows index the prefill pool."""

    prompts: tuple = ()  # prefill pool indices of the prompt rows, in packed order; (): decode-only
    prompt_works: tuple = ()  # their prompt tokens
    prompt_value: float = 0.0

    @property
    def prompt(self) -> int | None:
        """The first prompt row (the spec's one prompt row); None: decode-only."""
        return self.prompts[0] if self.prompts else None

    @property
    def prompt_work(self) -> int:
        """The prompt tokens of every prompt row together (the logical prompt work)."""
        return sum(self.prompt_works)


@dataclass(slots=True)
class _Decoders:
    """The decode pool ranked for one (W, D): cohorts are prefixes of `order`."""

    order: np.ndarray
    sums: list  # sums[m]: value of the top m
    recent: list  # recent[m - 1]: most recent service among the top m
    ceilings: np.ndarray | None  # rows per decoder (None: width one)


def _rank_decoders(pool: LanePool, shape, by_stall: bool = False) -> _Decoders:
    """`by_stall`: rank by the growing price instead of the lane value (_stall_ranked)."""
    if shape.token_capacity == 1:
        full, ceilings = pool.base, None
    else:
        ceilings = _ceilings(pool, shape)
        full = pool.base + _gains(pool, ceilings).sum(axis=1)
    order = ranked_lanes(pool.stall if by_stall else full, pool.lru, pool.slots)
    sums = [0.0, *np.cumsum(full[order]).tolist()]
    recent = np.maximum.accumulate(pool.lru[order]).tolist() if len(order) else []
    return _Decoders(order, sums, recent, ceilings)


def prompt_fill(pool: LanePool, chunk: int, budget: Budget, unit: np.ndarray, rows: int) -> tuple:
    """The prompt rows that fill `chunk` tokens in value order, at most `rows` of them: a tuple of
    (index, work, value), each the best remaining row for the budget the rows before it left."""
    fill, left, slots, pages = [], chunk, budget.free_slots, budget.free_pages
    while len(fill) < rows and left > 0:
        pick = _best_prompt(pool, left, Budget(slots, pages), unit, [f[0] for f in fill])
        if pick is None:
            break
        fill.append(pick)
        left -= pick[1]
        if not pool.resident[pick[0]]:  # a new request takes a slot and its pages at commit
            slots, pages = slots - 1, pages - int(pool.pages[pick[0]])
    return tuple(fill)


def _best_prompt(pool: LanePool, chunk: int, budget: Budget, unit: np.ndarray, taken=()):
    """(index, work, value) of the best prompt row that fits the free slots and pages, or None.
    `unit`: exp(pool.log_prefill), computed once for every chunk; `taken`: rows already packed."""
    works = np.minimum(pool.prompt_left, chunk)
    if pool.clip is not None:  # image requests: legal chunk ends only (vision.py)
        works = pool.clip(np.arange(len(works)), works)
    if taken:
        works[taken] = 0
    finishes = works == pool.prompt_left
    # Prompt tokens at 1 + f/x, plus one output token when the prompt completes.
    values = unit * works + np.where(finishes, pool.first_token, 0.0)
    for idx in ranked_lanes(values, pool.lru, pool.slots).tolist():
        if works[idx] == 0:
            continue
        if pool.resident[idx] or (budget.free_slots > 0 and int(pool.pages[idx]) <= budget.free_pages):
            return idx, int(works[idx]), float(values[idx])
    return None


def mixed_candidates(memo: Memo, shapes, costs, decode: LanePool, prompts: LanePool | None, waiting: float,
                     budget: Budget) -> list[Candidate]:
    """Every mixed shape's decode-only cohort and its cohorts with 1..R prompt rows, padding pruned."""
    n = len(decode.handles)
    has_prompts = prompts is not None and len(prompts.handles) > 0
    if not shapes or (n == 0 and not has_prompts):
        return []
    order, padded_over, chunks, constants, rows = by_identity(memo.orders, shapes, _padding_order, 64)
    fills = {}
    if has_prompts:
        unit = np.exp(prompts.log_prefill)
        fills = {c: prompt_fill(prompts, c, budget, unit, rows) for c in chunks}
    ranked: dict[tuple[int, int, bool], _Decoders] = {}
    cohorts: dict[tuple[int, int, int], tuple] = {}  # (W, D, m) -> what its decode cohort sums to
    out, pos_seen, t_ms, state, growth = [], -1, None, None, 0.0
    for pos, c, k, m in _survivors(memo, shapes, order, padded_over, chunks, n, fills):
        shape = order[pos]
        if pos != pos_seen:  # one estimate per shape, asked in shape order as before
            pos_seen, (t_ms, state) = pos, costs(shape)
            growth = 0.0 if t_ms is None or decode.stall_total <= 0.0 else stall_growth(t_ms, decode.tau_ms)
        if c is not None and _beyond_bound(prompts, t_ms, m == n):
            continue  # the off-by-default duration bound (StudyConfig.stall_bound_ms)
        wd = (shape.token_capacity, shape.proposal_depth)
        cohort = cohorts.get((*wd, m))
        if cohort is None:
            by_stall = _stall_ranked(decode, shape, m, n)
            dec = ranked.get((*wd, by_stall))
            if dec is None:
                dec = ranked[(*wd, by_stall)] = _rank_decoders(decode, shape, by_stall)
            cohort = cohorts[(*wd, m)] = _cohort(decode, dec, m, shape.token_capacity)
        out.append(_candidate(shape, decode, prompts, cohort, () if c is None else fills[c][:k], m,
                              t_ms, state, waiting, growth, constants[pos]))
    return out


def _beyond_bound(prompts: LanePool, t_ms: float | None, serves_all: bool) -> bool:
    """Whether a mixed graph with a prompt row breaks the off-by-default duration bound: the oldest
    decoder's age + T must stay within it, + the fastest decode step when some decoder is left out
    (then its token needs that step after this graph), as for a prefill graph."""
    if prompts.stall_bound_ms is None or t_ms is None:
        return False
    return t_ms > prompts.stall_bound_ms + (prompts.stall_step_ms if serves_all else 0.0)


def _stall_ranked(decode: LanePool, shape, m: int, n: int) -> bool:
    """Whether the best m of n width-one decoders are those with the largest growing prices. With the
    deferred step a left-out decoder's value still counts (at the step's end), so the cohort changes
    only the stall charges: serving lane i saves s_i (g(T) - g(T - step(m))) / T, with s_i its
    growing price (f/x + g/z) and g >= 0 increasing, so the top-m by s_i is exact for every T."""
    if decode.deferred is None or decode.stall is None or shape.token_capacity != 1 or not 0 < m < n:
        return False
    return decode.deferred.step(n - m) is not None


def _survivors(memo: Memo, shapes, order, padded_over, chunks, n: int, fills: dict) -> tuple:
    """(position, prompt chunk or None, prompt rows k, m) of every cohort that is not padding, in
    shape order.

    Which cohorts survive depends only on the shapes, n, and which chunks have prompt fills and
    which of their prefixes are the same rows and works: not on values or durations. So the
    pruning walk runs once per such pattern and the decision only builds the survivors."""
    prefixes = [[tuple(f[:2] for f in fills.get(c, ())[:k]) for k in range(1, len(fills.get(c, ())) + 1)]
                for c in chunks]
    # Each (chunk, k) is labelled by the first chunk whose first k rows are the same rows and works.
    pattern = tuple(tuple(next(j for j in range(len(chunks)) if len(prefixes[j]) >= k and prefixes[j][k - 1] == p)
                          for k, p in enumerate(ps, 1)) for ps in prefixes)
    key = (id(shapes), n, pattern)
    hit = memo.survivors.get(key)
    if hit is not None and hit[0] is shapes:
        return hit[1]
    label = dict(zip(chunks, pattern))
    seen: dict[tuple, set] = {}  # cohort key -> positions of the shapes that served it
    found = []
    for pos, shape in enumerate(order):
        b, c = shape.batch_capacity, shape.prefill_capacity
        options = []
        if n:
            options.append((None, 0, min(b, n)))
        for k in range(1, min(len(label.get(c, ())), shape.prompt_rows) + 1):
            options.append((c, k, min(b - k, n)))
        for prompt, k, m in options:
            # Cohorts of one (W, D) are prefixes of one ranking with fixed prefixes, so (W, D, m)
            # names the decode cohort and its prefixes; the prompt rows are named by their rows and
            # works (here by the first chunk whose first k rows are the same, and k).
            same = seen.setdefault((shape.token_capacity, shape.proposal_depth, m,
                                    None if prompt is None else (label[prompt][k - 1], k)), set())
            if not padded_over[pos].isdisjoint(same):
                continue  # same cohort, prefixes, prompt rows and prompt work: padding only
            same.add(pos)
            found.append((pos, prompt, k, m))
    if len(memo.survivors) >= 4096:
        memo.survivors.clear()
    memo.survivors[key] = (shapes, tuple(found))  # keeps `shapes` alive: its id is not reused
    return memo.survivors[key][1]


def _cohort(decode: LanePool, dec: _Decoders, m: int, width: int) -> tuple:
    """(members, rows, value, lru, served stall, decode tokens, served base) of the top m decoders
    of one (W, D): shared by every shape and prompt row with that cohort."""
    members = dec.order[:m]
    rows = None if dec.ceilings is None else dec.ceilings[members]
    served_stall = float(decode.stall[members].sum()) if decode.stall is not None and m else 0.0
    used = m * width if rows is None else sum(rows.tolist())
    # Their next-step values alone (without speculative gains): what deferring them would leave out.
    served_base = float(decode.base[members].sum()) if decode.deferred is not None and m else 0.0
    return members, rows, dec.sums[m], dec.recent[m - 1] if m else 0, served_stall, used, served_base


def _candidate(shape, decode, prompts, cohort: tuple, prompt, m, t_ms, state: CostState, waiting,
               growth: float, constants: tuple) -> MixedCandidate:
    """`prompt`: the prompt rows, (index, work, value) each; `growth`: stall_growth(t_ms, tau) of
    this shape; `constants`: its extent and tie-break."""
    members, rows, value, lru, served_stall, used, served_base = cohort
    work, pvalue = 0, 0.0
    for pidx, pwork, pval in prompt:
        work += pwork
        pvalue += pval
        value += pval
        lru = max(lru, int(prompts.lru[pidx]))
    slope = decode.age_slope * m
    # An unknown duration ranks by expected useful value alone (optimistic work score).
    if t_ms is None:
        score = value
    elif decode.deferred is not None:  # the decoders it leaves out still need their step
        score = decode.deferred.score(value, slope, t_ms, waiting, m, served_base)
    else:
        score = rate_score(value, slope, t_ms, waiting)
    if t_ms is not None and decode.stall_total > 0.0:
        # Priced stalls (docs/scheduling-utility.md): the decoders this graph leaves out owe the
        # growth of their prices over T (utility.stall_cost); a prompt row serves no decoder.
        score -= (decode.stall_total - served_stall) * growth / t_ms
        if decode.steps is not None and m:
            # The decoders it serves wait past their own decode step for their token: for that
            # excess they are stalled, and owe the same growth (utility.served_cost).
            score -= served_cost(served_stall, t_ms, decode.steps[m], decode.tau_ms)
    extent, order = constants
    padding = extent - (work + used)
    # The same tie-break order as every other candidate (policy.finish_candidate).
    key = (t_ms is None, score, -(t_ms or 0.0), m + len(prompt), -lru, -padding, order)
    return MixedCandidate(shape, members, _NO_WORK[:m], value, slope, t_ms, state, score, lru, padding, key,
                          rows, rows, prompts=tuple(p[0] for p in prompt),
                          prompt_works=tuple(p[1] for p in prompt), prompt_value=pvalue)


def _padding_order(shapes) -> tuple:
    """The shapes sorted by capacities (a dominating, padded shape always comes after the one it
    pads), for each position the positions of the shapes it is padding over (those that
    dominate it), the distinct prompt chunks, and each shape's packed extent and tie-break
    tuple: static, so computed once per shape tuple (Memo.orders) instead of pairwise per decision;
    and the most prompt rows any of them packs."""
    order = tuple(sorted(shapes, key=lambda s: s.capacities()))
    return (order, [frozenset(i for i, other in enumerate(order) if other.dominates(shape)) for shape in order],
            tuple(sorted({s.prefill_capacity for s in order})),
            [(s.max_packed_extent, tuple(map(neg, s.capacities()))) for s in order],
            max(s.prompt_rows for s in order))


_NO_WORK = np.zeros(64, dtype=np.int64)  # decode rows consume no prompt (at most 64 rows)
_NO_WORK.setflags(write=False)


def mixed_lanes(table, winner: MixedCandidate, view) -> PlanLanes:
    """The winner's dense lane list (a PlanningView's pools): the prompt rows first, then its
    decode rows, each priced as its separate family prices it."""
    t_ms = winner.t_ms or 0.0
    drows = view.decode_rows[winner.members]
    parts = []
    if winner.prompts:
        prow = view.prefill[GraphKind.PREFILL][1][list(winner.prompts)]
        parts.append(prefill_lanes(table, prow, np.array(winner.prompt_works)))
    if len(drows):
        if winner.rows is None:
            values = view.decode.base[winner.members] + view.decode.age_slope * t_ms
            parts.append(decode_lanes(table, drows, values))
        else:
            values, expected = spec_row_values(view.decode, winner.members, winner.rows, t_ms)
            parts.append(speculative_lanes(table, drows, winner.rows, expected, values, winner.rows))
    if len(parts) == 1:
        return parts[0]
    return PlanLanes(**{f.name: np.concatenate([getattr(p, f.name) for p in parts]) for f in fields(PlanLanes)})


def spec_row_values(pool: LanePool, members: np.ndarray, rows: np.ndarray, t_ms: float):
    """Scaled lane values and expected tokens of speculative decode rows at their full prefix
    (speculation.expected_output per lane, with alpha in the values)."""
    # A lane's drafts are its first rows - 1 positions: running sums (left to right, as a short
    # slice's sum adds) read at the last one, zero without drafts.
    last, k = rows - 2, np.arange(len(members))

    def drafts(m: np.ndarray) -> np.ndarray:
        if not m.shape[1]:
            return np.zeros(len(members))
        return np.where(last >= 0, np.cumsum(m[members], axis=1)[k, np.maximum(last, 0)], 0.0)
    values = pool.base[members] + pool.extra_value[members] * drafts(pool.survival_alpha) + pool.age_slope * t_ms
    return values, 1.0 + drafts(pool.survival)

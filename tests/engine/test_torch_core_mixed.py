"""TorchCore's packed forward with the real SmolLM2: mixed graphs (prompt chunks and ordinary or
copy-speculative decode rows in one forward) and packed multi-row prefill plans."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from helios.engine.torch_core import PlanMismatch, TorchCore
from helios.errors import InvalidRequest
from helios.graphs import Catalog, GraphKind, GraphShape

sys.path.insert(0, str(Path(__file__).parent))
from torch_helpers import chat, lane, loaded, plan  # noqa: E402,F401 (loaded is a fixture)

MAX_CONTEXT = 512
MIXED = GraphShape(GraphKind.MIXED, 4, 1, 0, 0, 128)
MIXED64 = GraphShape(GraphKind.MIXED, 2, 1, 0, 0, 64)
MIXED8 = GraphShape(GraphKind.MIXED, 8, 1, 0, 0, 64, prompt_rows=3)  # the extension: R = 3 share C
SPEC_MIXED = GraphShape(GraphKind.MIXED, 4, 4, 3, 0, 128)
PREFILL = GraphShape(GraphKind.PREFILL, 1, 256)
PREFILL2 = GraphShape(GraphKind.PREFILL, 2, 64)
QUESTIONS = ("What is the capital of France?", "Name three colors.", "Write a haiku about the sea.")


def make_core(loaded, shapes=(MIXED,), **kw):
    kw.setdefault("max_context", MAX_CONTEXT)
    kw.setdefault("prefill_chunks", (64, 256))
    core = TorchCore(loaded=loaded, **kw)
    # The mixed catalog rule is the scheduler side's (helios.prepare); these tests hand-build plans.
    core.catalog = Catalog([*core.catalog, *shapes])
    return core


def prefill(core, h, prompt, shape=PREFILL):
    core.attach(h, prompt)
    return core.execute(plan(shape, [lane(h, h, 0, len(prompt), 0, 1)]), 100 + h).records[0].tokens


def decode_lane(core, h, rows=1):
    r = core.requests[h]
    return lane(h, h, context=r.kv_len + 1, rows=rows)


def test_mixed_equals_separate_prefill_and_decode(loaded):
    """Two decoders and a finishing prompt in one mixed forward give the tokens of a decode graph and a
    prefill graph run one after the other (greedy), and so do the decode steps after it."""
    tok = loaded.tokenizer
    prompts = [chat(tok, q) for q in QUESTIONS]
    outputs = []
    for mixed in (False, True):
        core = make_core(loaded)
        for h in (0, 1):
            prefill(core, h, prompts[h])
        core.attach(2, prompts[2])
        new = lane(2, 2, 0, len(prompts[2]), 0, 1)
        decoders = [decode_lane(core, 0), decode_lane(core, 1)]
        if mixed:
            recs = core.execute(plan(MIXED, [new, *decoders]), 1).records
            assert [r.prompt_tokens for r in recs] == [len(prompts[2]), 0, 0]
            assert [len(r.tokens) for r in recs] == [1, 1, 1]
        else:
            core.execute(plan(GraphShape(GraphKind.DECODE, 2), decoders), 1)
            core.execute(plan(PREFILL, [new]), 2)
        for step in range(3):
            core.execute(plan(GraphShape(GraphKind.DECODE, 4), [decode_lane(core, h) for h in range(3)]), 10 + step)
        outputs.append([core.requests[h].generated for h in range(3)])
    assert outputs[0] == outputs[1]
    assert [len(g) for g in outputs[1]] == [5, 5, 4]


def test_chunked_mixed_prompt_equals_one_shot(loaded):
    """A prompt consumed in chunks by mixed graphs (next to a decoder) equals a one-shot prefill."""
    tok = loaded.tokenizer
    long_prompt = chat(tok, "Explain in detail why the sky is blue, and then why sunsets are red. " * 8)
    assert 2 * 64 < len(long_prompt) <= 256
    core = make_core(loaded)
    one_shot = prefill(core, 0, long_prompt)
    core.detach(0)

    core = make_core(loaded, shapes=(MIXED64,))
    prefill(core, 1, chat(tok, QUESTIONS[0]))
    core.attach(0, long_prompt)
    done, fence, first = 0, 1, None
    while done < len(long_prompt):
        n = min(64, len(long_prompt) - done)
        finishes = done + n == len(long_prompt)
        prompt_lane = lane(0, 0, done, n, done, int(finishes))
        recs = core.execute(plan(MIXED64, [decode_lane(core, 1), prompt_lane]), fence).records
        assert recs[1].prompt_tokens == n and len(recs[1].tokens) == int(finishes)
        assert len(recs[0].tokens) == 1  # the decoder advanced in every chunk's forward
        first = recs[1].tokens if finishes else first
        done, fence = done + n, fence + 1
    assert core.last_packing.query_lengths == (1, len(long_prompt) - 2 * 64) and fence == 4
    assert first == one_shot


def test_several_prompt_rows_in_one_mixed_forward(loaded):
    """The extension past the spec's one prompt row: three prompt rows sharing C = 64 (a suffix after a
    checkpoint restore, a second chunk after an earlier one, a first chunk that does not finish) and
    two decoders, interleaved, run as ONE packed forward with no padding between rows. Greedy tokens
    (and their log-probabilities) match separate prefills of the same chunks and a decode-only run,
    then and in later decode steps."""
    tok = loaded.tokenizer
    prompts = [chat(tok, q) for q in ("Name a fruit.", "Name an animal.", *QUESTIONS)]
    results = []
    for mixed in (False, True):
        core = make_core(loaded, shapes=(MIXED8,), request_slots=5, max_batch=8, checkpoint_memory=1 << 24)
        logprobs: dict = {h: [] for h in range(5)}

        def run(shape, lanes, fence):
            execution = core.execute(plan(shape, lanes), fence)
            for h, entries in (execution.logprobs or {}).items():
                logprobs[h] += [e.logprob for e in entries]
            return {r.handle: r for r in execution.records}

        for h in range(5):
            core.attach(h, prompts[h], logprobs=0)
        for h in (0, 1):
            run(PREFILL, [lane(h, h, 0, len(prompts[h]), 0, 1)], h)
        run(PREFILL, [lane(2, 2, 0, 16, 0, 0)], 2)
        run(PREFILL, [lane(3, 3, 0, 16, 0, 0)], 3)
        # Request 2 is preempted after 16 prompt tokens and resumed from its checkpoint.
        run(GraphShape(GraphKind.SNAPSHOT, 1), [lane(2, 2, 0, 0, 16, 0)], 4)
        run(GraphShape(GraphKind.RESTORE, 1), [lane(2, 2, 0, 0, 16, 0)], 5)
        n2, n3 = len(prompts[2]) - 16, len(prompts[3]) - 16
        n4 = 64 - n2 - n3  # the three prompt rows fill C exactly
        assert 0 < n4 < len(prompts[4])
        rows = {0: decode_lane(core, 0), 1: decode_lane(core, 1), 2: lane(2, 2, 16, n2, 16, 1),
                3: lane(3, 3, 16, n3, 16, 1), 4: lane(4, 4, 0, n4, 0, 0)}
        if mixed:
            order = (0, 2, 1, 3, 4)  # prompt rows between decode rows: offsets follow lane order
            recs = run(MIXED8, [rows[h] for h in order], 6)
            p = core.last_packing
            assert p.query_lengths == (1, n2, 1, n3, n4)
            assert p.offsets == (0, 1, 1 + n2, 2 + n2, 2 + n2 + n3, 66)  # no padding between rows
            assert [len(recs[h].tokens) for h in order] == [1, 1, 1, 1, 0]
            with pytest.raises((PlanMismatch, InvalidRequest), match="prompt rows exceed their packed capacity"):
                plan(MIXED8, [rows[2], rows[3], lane(4, 4, 0, n4 + 1, 0, 0)])  # one token past the shared C
            with pytest.raises((PlanMismatch, InvalidRequest), match="at most 3 prompt rows"):
                plan(MIXED8, [rows[2], rows[3], lane(4, 4, 0, 2, 0, 0), lane(5, 5, 0, 2, 0, 0)])
        else:
            recs = run(GraphShape(GraphKind.DECODE, 2), [rows[0], rows[1]], 6)
            for h in (2, 3, 4):
                recs.update(run(PREFILL, [rows[h]], 5 + h))
        first = {h: recs[h].tokens for h in range(5)}
        run(PREFILL, [lane(4, 4, n4, len(prompts[4]) - n4, n4, 1)], 10)
        for step in range(2):
            run(GraphShape(GraphKind.DECODE, 8), [decode_lane(core, h) for h in range(5)], 11 + step)
        results.append((first, [core.requests[h].generated for h in range(5)], logprobs))
    assert results[0][:2] == results[1][:2]
    assert [len(g) for g in results[1][1]] == [4, 4, 3, 3, 3]
    # The packed and rectangular forwards differ by ~1e-5 here; a prompt row shifted by one position
    # moves its log-probabilities by ~0.1 while its greedy tokens stay the same.
    for h in range(5):
        assert results[1][2][h] == pytest.approx(results[0][2][h], abs=1e-3)


def test_speculative_decode_rows_in_a_mixed_forward(loaded):
    """Copy-speculative rows verified in a mixed forward commit what a speculative round would."""
    tok = loaded.tokenizer
    prompts = [chat(tok, "Repeat after me: one two three, one two three, one two three."), chat(tok, QUESTIONS[1])]
    results = []
    for mixed in (False, True):
        core = make_core(loaded, shapes=(SPEC_MIXED,), speculation="fixed", widths=(4,))
        prefill(core, 0, prompts[0])
        core.attach(1, prompts[1])
        new = lane(1, 1, 0, len(prompts[1]), 0, 1)
        for step in range(4):
            spec = decode_lane(core, 0, rows=4)
            if mixed and step == 0:
                recs = core.execute(plan(SPEC_MIXED, [new, spec]), 1).records
                assert recs[1].offered is not None and recs[1].prompt_tokens == 0
            elif step == 0:
                core.execute(plan(PREFILL, [new]), 1)
                core.execute(plan(GraphShape(GraphKind.SPECULATIVE, 1, 4, 3), [spec]), 2)
            else:
                core.execute(plan(GraphShape(GraphKind.SPECULATIVE, 1, 4, 3), [spec]), 10 + step)
        results.append([core.requests[h].generated for h in (0, 1)])
    assert results[0] == results[1]


def test_packed_prompt_offsets_one_query_length_upload_and_sampling_mask(loaded):
    tok = loaded.tokenizer
    core = make_core(loaded)
    prefill(core, 0, chat(tok, QUESTIONS[0]))
    prefill(core, 1, chat(tok, QUESTIONS[1]))
    prompt = chat(tok, QUESTIONS[2])
    core.attach(2, prompt)
    # The prompt row in the middle: its tokens sit at its packed offset, the prefix sum before it.
    chunk = lane(2, 2, 0, 20, 0, 0)
    recs = core.execute(plan(MIXED, [decode_lane(core, 0), chunk, decode_lane(core, 1)]), 1).records
    p = core.last_packing
    assert p.query_lengths == (1, 20, 1) and p.offsets == (0, 1, 21, 22)
    assert p.sample_mask == (True, False, True, False)  # the unfinished prompt row samples nothing
    assert recs[1].tokens == () and len(recs[0].tokens) == len(recs[2].tokens) == 1
    g = core.packed[MIXED]
    assert set(g.buffers) == {"tokens", "positions", "query_lengths", "slots", "logits_at"}
    assert g.buffers["query_lengths"].tolist() == [1, 20, 1, 0]  # the one query-length tensor
    assert g.buffers["tokens"][1:21].tolist() == list(prompt[:20])
    assert g.buffers["positions"][1:21].tolist() == list(range(20))
    assert g.buffers["logits_at"][:3, 0].tolist() == [0, 20, 21]
    assert g.extent == 128 + 3 * 1 and core.requests[2].kv_len == 20


def test_padding_and_inactive_rows_leave_the_cache_untouched(loaded):
    tok = loaded.tokenizer
    core = make_core(loaded, request_slots=4)
    prefill(core, 0, chat(tok, QUESTIONS[0]))
    kv = core.requests[0].kv_len
    core.attach(1, chat(tok, QUESTIONS[1]))
    before_k, before_v = core.cache.k.clone(), core.cache.v.clone()
    core.execute(plan(MIXED, [lane(1, 1, 0, 10, 0, 0), decode_lane(core, 0)]), 1)
    changed = (core.cache.k != before_k).any(dim=(0, 2, 4)) | (core.cache.v != before_v).any(dim=(0, 2, 4))
    slots = core.cache.num_slots
    # Slot 0: only the decoder's pending position kv; slot 1: prompt positions 0..9; slots 2, 3 untouched.
    assert changed[0].nonzero().flatten().tolist() == [kv]
    assert changed[1].nonzero().flatten().tolist() == list(range(10))
    assert not changed[2:slots].any()


def test_role_validation(loaded):
    """Two prompt rows in the spec's one-prompt-row shape, a prompt row beyond C or claiming a first token
    it cannot sample, decode rows wider than W: each is a clear error, and nothing runs."""
    tok = loaded.tokenizer
    core = make_core(loaded)
    prefill(core, 0, chat(tok, QUESTIONS[0]))
    core.attach(1, chat(tok, QUESTIONS[1]))
    core.attach(2, chat(tok, QUESTIONS[2]))
    roles = (PlanMismatch, InvalidRequest)  # ScheduledPlan checks mixed roles as it is built
    with pytest.raises(roles, match="at most one prompt row"):
        core.execute(plan(MIXED, [lane(1, 1, 0, 5, 0, 0), lane(2, 2, 0, 5, 0, 0)]), 1)
    with pytest.raises(roles, match="prompt row exceeds its capacity"):
        core.execute(plan(MIXED, [lane(1, 1, 0, 129, 0, 0), decode_lane(core, 0)]), 2)
    with pytest.raises(roles, match="1 output rows for a chunk that does not finish"):
        core.execute(plan(MIXED, [lane(1, 1, 0, 5, 0, 1), decode_lane(core, 0)]), 3)
    with pytest.raises(roles, match="output rows"):  # an ordinary mixed graph verifies width one
        core.execute(plan(MIXED, [lane(1, 1, 0, 5, 0, 0), decode_lane(core, 0, rows=2)]), 4)
    assert core.requests[1].kv_len == 0 and not core.requests[2].kv_len  # nothing ran
    assert core.requests[0].kv_len == len(chat(tok, QUESTIONS[0]))


def test_packed_prefill_rows_by_prefix_sums(loaded):
    """A 2 x 64 prefill graph packs an 80-token prompt and a 30-token one (80 > C = 64) in one forward;
    each matches a one-shot prefill alone."""
    tok = loaded.tokenizer
    long_prompt = chat(tok, "Describe the water cycle: evaporation, condensation, precipitation and collection. " * 4)
    short = chat(tok, QUESTIONS[1])[:min(30, 128 - len(long_prompt))]
    assert 64 < len(long_prompt) and len(long_prompt) + len(short) <= 128
    alone = []
    for h, p in enumerate((long_prompt, short)):
        core = make_core(loaded)
        alone.append(prefill(core, h, p))
    core = make_core(loaded)
    core.attach(0, long_prompt)
    core.attach(1, short)
    recs = core.execute(plan(PREFILL2, [lane(0, 0, 0, len(long_prompt), 0, 1), lane(1, 1, 0, len(short), 0, 1)]), 1).records
    assert core.last_packing.offsets == (0, len(long_prompt), len(long_prompt) + len(short))
    assert [r.tokens for r in recs] == alone
    with pytest.raises(PlanMismatch, match="packed capacity"):
        core.attach(2, long_prompt)
        core.attach(3, long_prompt)
        core.execute(plan(PREFILL2, [lane(2, 2, 0, len(long_prompt), 0, 1), lane(3, 3, 0, len(long_prompt), 0, 1)]), 2)


def test_mixed_graph_timing_runs_on_scratch_only(loaded):
    core = make_core(loaded, request_slots=2)
    core.cache.k[:, :2] = 3.0
    assert core.time_graph(MIXED) > 0
    assert bool((core.cache.k[:, :2] == 3.0).all())
    assert torch.isfinite(core.cache.k[:, core.cache.scratch_slot]).all()

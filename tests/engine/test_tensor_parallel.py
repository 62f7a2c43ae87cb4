"""Tensor-parallel TorchCore with 2 ranks on the CPU (gloo): the rank contract.

Each TensorParallelCore start spawns a rank and loads the checkpoint twice (about a minute on
a loaded 2-core box), so the module starts one per catalog (ordinary, speculative) and reuses
it. Every collective is bounded by the process group's timeout (TIMEOUT_S): nothing can hang.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
import textwrap
import time

import pytest
import torch

from helios.config import PolicyConfig
from helios.engine.tensor_parallel import RankMismatch, TensorParallelCore, kv_head_ranges, shard_weights
from helios.engine.torch_core import TorchCore
from helios.errors import ConfigError
from helios.graphs import GraphKind, GraphShape
from helios.runtime.driver import SyncDriver
from helios.scheduler import Scheduler

sys.path.insert(0, str(Path(__file__).parent))
from torch_helpers import chat, lane, loaded, plan  # noqa: E402,F401 (loaded is a fixture)

TIMEOUT_S = 90
CORE = dict(max_context=192, prefill_chunks=(64,), max_batch=2, request_slots=2)
QUESTIONS = ("What is the capital of France?", "Name a primary color.")
MAX_TOKENS = 10


@pytest.fixture(scope="module")
def tp(loaded):
    core = TensorParallelCore(2, num_threads=1, timeout_s=TIMEOUT_S, **CORE)
    yield core
    core.close()


def generate(core, prompts, max_tokens):
    d = SyncDriver(Scheduler(core.catalog, PolicyConfig(), core.scheduler_config()), core)
    handles = [d.submit(p, max_tokens) for p in prompts]
    d.run()
    return [d.requests[h].tokens for h in handles], d


def test_sharding_scheme():
    assert [list(r) for r in kv_head_ranges(3, 2)] == [[0, 1], [2]]  # uneven but exact
    assert [list(r) for r in kv_head_ranges(3, 3)] == [[0], [1], [2]]
    with pytest.raises(ConfigError):
        kv_head_ranges(3, 4)


def test_shards_sum_to_the_full_model(loaded):
    """Per layer, the ranks' partial attention/MLP outputs add up to the unsharded block's."""
    from helios.engine.model import load_weights
    from helios.engine.model.llama import Block
    config, weights = load_weights()
    x = torch.randn(1, 3, config.dim)
    full = Block(config, weights, 0, pack=False)
    parts = [Block(*shard_weights(config, weights, r, 2), 0, pack=False) for r in range(2)]
    # MLP: down(silu(gate) * up) of the full width == the sum of both ranks' halves.
    def mlp(b, xin):
        gate, up = b.w13(xin).chunk(2, dim=-1)
        return b.w2(torch.nn.functional.silu(gate) * up)
    assert torch.allclose(mlp(full, x), mlp(parts[0], x) + mlp(parts[1], x), rtol=1e-4, atol=1e-3)


def test_greedy_tokens_match_one_rank(loaded, tp):
    """Prefill and decode: the golden prompts give the same greedy tokens on 2 ranks as on 1."""
    tok = tp.tokenizer
    prompts = [chat(tok, q) for q in QUESTIONS]
    two, d = generate(tp, prompts, MAX_TOKENS)
    one, _ = generate(TorchCore(loaded=loaded, **CORE), prompts, MAX_TOKENS)
    assert two == one
    assert "Paris" in tok.decode(two[0])
    kinds = {p.shape.kind for p in d.history}
    assert GraphKind.DECODE in kinds and any(k.is_prefill for k in kinds)
    assert not tp.requests  # every request detached on rank 0 (and, by the same ops, rank 1)
    assert all(c > 0 for c in tp.last_collective_ns)


def test_cost_sample_is_the_maximum_rank_interval(tp):
    tp.attach(100, [1, 2, 3, 4])
    tp.inject_fault(1, ("skew", 5.0))  # rank 1 reports 5 s more than it measured
    ex = tp.execute(plan(GraphShape(GraphKind.PREFILL, 1, 64), [lane(100, None, 0, 4, 0, 1)]), 1)
    tp.detach(100)
    intervals = ex.timing.rank_intervals_ns
    assert len(intervals) == 2 and all(i > 0 for i in intervals)
    assert intervals[1] >= 5_000_000_000 > intervals[0]
    assert ex.timing.cost_sample_ns() == ex.timing.device_interval_ns() == max(intervals) == intervals[1]
    assert ex.duration_ns == intervals[1]


def test_log_probabilities_come_back_from_rank_0(loaded, tp):
    """An execution's fields other than timing (here the output's log-probabilities) are rank 0's."""
    prompt = chat(tp.tokenizer, QUESTIONS[0])
    shape = GraphShape(GraphKind.PREFILL, 1, 64)
    got = []
    for core in (tp, TorchCore(loaded=loaded, **CORE)):
        core.attach(101, prompt, logprobs=2)
        ex = core.execute(plan(shape, [lane(101, None, 0, len(prompt), 0, 1)]), 1)
        core.detach(101)
        got.append(ex.logprobs[101])
    assert len(got[0]) == 1 and len(got[0][0].top) == 2
    assert got[0][0].top[0][0] == got[1][0].top[0][0]
    assert abs(got[0][0].logprob - got[1][0].logprob) < 1e-3


def test_faults_on_rank_1_fail_only_that_plan(loaded, tp):
    pre64 = GraphShape(GraphKind.PREFILL, 1, 64)
    dec1 = GraphShape(GraphKind.DECODE, 1)
    a, b = [5, 6, 7, 8, 9], [10, 11, 12, 13]
    ref = TorchCore(loaded=loaded, **CORE)
    tp.attach(200, a)
    tp.attach(201, b)
    ref.attach(201, b)

    # A preflight error on rank 1: nothing runs on any rank; request 200's state is untouched.
    tp.inject_fault(1, "preflight")
    with pytest.raises(RankMismatch, match="rank 1: RuntimeError: injected fault"):
        tp.execute(plan(pre64, [lane(200, None, 0, 5, 0, 1)]), 1)
    r = tp.requests[200]
    assert r.kv_len == 0 and r.slot is None and not r.generated
    tp.detach(200)  # what the step loop does once it failed the plan's requests

    # Another request's plans run on, and match one rank.
    p = plan(pre64, [lane(201, None, 0, 4, 0, 1)])
    assert tp.execute(p, 2).records == ref.execute(p, 2).records
    slot = tp.requests[201].slot  # slot numbers may differ from ref's (earlier tests freed slots)

    # Rank 1 disagreeing on an identity: a clear error, nothing executed, the same plan then runs.
    d = plan(dec1, [lane(201, slot, 4, 0, 5)])
    tp.inject_fault(1, "identity")
    with pytest.raises(RankMismatch, match=r"ranks \[1\] disagree with rank 0 on the identities"):
        tp.execute(d, 3)
    assert tp.requests[201].kv_len == 4
    assert tp.execute(d, 4).records == ref.execute(plan(dec1, [lane(201, ref.requests[201].slot, 4, 0, 5)]), 4).records

    # An error on rank 1 after its forward: reported, not hung; the ranks keep serving.
    tp.inject_fault(1, "execute")
    with pytest.raises(RankMismatch, match="after the forward"):
        tp.execute(plan(dec1, [lane(201, slot, 4, 0, 6)]), 5)
    tp.detach(201)
    tp.attach(202, b)
    assert tp.execute(plan(pre64, [lane(202, None, 0, 4, 0, 1)]), 6).records[0].tokens
    tp.detach(202)
    assert all(p.is_alive() for p in tp.procs)


def test_close_leaves_no_rank_running(tp):
    pids = tp.pids[1:]
    tp.close()
    tp.close()  # idempotent
    _assert_gone(pids)
    with pytest.raises(RankMismatch, match="closed"):
        tp.execute(plan(GraphShape(GraphKind.DECODE, 1), [lane(0, 0, 1, 0, 2)]), 1)


def test_copy_speculation_matches_one_rank(loaded):
    kw = dict(CORE, speculation="adaptive", widths=(1, 2, 4), speculative_token_capacity=8)
    with TensorParallelCore(2, num_threads=1, timeout_s=TIMEOUT_S, **kw) as tp2:
        tok = tp2.tokenizer
        prompts = [chat(tok, "Repeat after me: one two three, one two three, one two three.")]
        two, d = generate(tp2, prompts, MAX_TOKENS)
        pids = tp2.pids[1:]
    one, _ = generate(TorchCore(loaded=loaded, **kw), prompts, MAX_TOKENS)
    assert two == one
    assert any(p.shape.kind is GraphKind.SPECULATIVE and p.shape.proposal_depth for p in d.history)
    _assert_gone(pids)  # close() stopped and reaped every rank


def _assert_gone(pids, within_s=15.0):
    deadline = time.monotonic() + within_s
    for pid in pids:
        while True:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            # a zombie still answers kill(0): check its state
            try:
                with open(f"/proc/{pid}/stat") as f:
                    if f.read().split(")")[-1].split()[0] == "Z":
                        break
            except FileNotFoundError:
                break
            assert time.monotonic() < deadline, f"rank pid {pid} is still running"
            time.sleep(0.2)


def test_sigterm_of_rank_0_stops_every_rank(tmp_path):
    """Rank 0's process killed by SIGTERM: the ranks it spawned exit too (no orphans)."""
    script = tmp_path / "rank0.py"
    script.write_text(textwrap.dedent(f"""
        import sys, time, torch
        sys.path.insert(0, {os.getcwd()!r})
        from helios.engine.tensor_parallel import TensorParallelCore
        if __name__ == "__main__":
            core = TensorParallelCore(2, num_threads=1, timeout_s={TIMEOUT_S}, max_context=128,
                                      prefill_chunks=(64,), max_batch=1, request_slots=1)
            print(" ".join(map(str, core.pids)), flush=True)
            time.sleep(600)
    """))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        pids = [int(x) for x in line.split()]
        assert len(pids) == 2, line
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        _assert_gone(pids[1:])
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_mixed_forward_matches_one_rank(loaded):
    """The packed mixed forward shares TorchCore's execution on every rank: a prompt row and a decode
    row in one mixed graph give the one-rank tokens."""
    kw = dict(CORE, mixed_prefill=True)
    mixed = GraphShape(GraphKind.MIXED, 2, 1, 0, 0, 64)
    tok = loaded.tokenizer
    prompts = [chat(tok, q) for q in QUESTIONS]
    n0, n1 = map(len, prompts)
    assert max(n0, n1) <= 64

    def run(core):
        core.attach(0, prompts[0])
        core.attach(1, prompts[1])
        core.execute(plan(GraphShape(GraphKind.PREFILL, 1, 64), [lane(0, 0, 0, n0, 0, 1)]), 1)
        recs = core.execute(plan(mixed, [lane(1, 1, 0, n1, 0, 1), lane(0, 0, context=n0 + 1)]), 2).records
        recs += core.execute(plan(GraphShape(GraphKind.DECODE, 2), [lane(0, 0, context=n0 + 2),
                                                                    lane(1, 1, context=n1 + 1)]), 3).records
        return [r.tokens for r in recs]

    with TensorParallelCore(2, num_threads=1, timeout_s=TIMEOUT_S, **kw) as tp2:
        assert mixed in tp2.catalog
        two = run(tp2)
    assert two == run(TorchCore(loaded=loaded, **kw))

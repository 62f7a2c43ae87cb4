"""Checkpoint snapshot and restore on the real model: the same tokens with and without restore,
no lost request under memory pressure, and guards that outlive cancellation."""

from __future__ import annotations

import pytest

from helios.engine.torch_core import TorchCore
from helios.graphs import GraphKind
from helios.runtime.driver import SyncDriver
from helios.scheduler import Scheduler
from helios.server.anchors import message_endpoints

from tests.engine.torch_helpers import loaded  # noqa: F401  (module fixture)

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
QUESTIONS = ("Name a color.", "Name a fruit.", "Name an animal.")
MIB = 1 << 20


def core_and_driver(loaded, memory: int, slots: int = 2):  # noqa: F811
    core = TorchCore(loaded=loaded, request_slots=slots, max_context=384, prefill_chunks=(64,),
                     max_batch=2, checkpoint_memory=memory)
    return core, SyncDriver(Scheduler(core.catalog, config=core.scheduler_config()), core)


def prompt_of(tok, messages):
    text = tok.apply_chat_template(messages, add_generation_prompt=True)
    ids = tok.encode(text)
    return ids, message_endpoints(tok, messages, text, ids)


def run_turns(loaded, memory: int, conversations: int, turns: int = 2, tokens: int = 6):  # noqa: F811
    """Every conversation's turns in order (turn k extends turn k-1's reply); conversations are
    interleaved turn by turn so checkpoints compete for the store. Returns replies, the core and
    the executed plan kinds."""
    core, driver = core_and_driver(loaded, memory)
    tok = core.tokenizer
    history = [[] for _ in range(conversations)]
    replies = [[] for _ in range(conversations)]
    for turn in range(turns):
        handles = []
        for c in range(conversations):
            history[c].append({"role": "user", "content": f"{QUESTIONS[c % 3]} Turn {turn}."})
            ids, ends = prompt_of(tok, history[c])
            handles.append(driver.submit(ids, tokens, ends, temperature=0.0))
        driver.run()
        for c, h in enumerate(handles):
            out = driver.requests[h].tokens
            assert driver.requests[h].finish is not None  # nothing lost
            replies[c].append(tuple(out))
            text = tok.decode([t for t in out if t != tok.eos_id])
            history[c].append({"role": "assistant", "content": text})
    return replies, core, [p.shape.kind for p in driver.history]


def test_restore_gives_the_same_tokens_as_prefill(loaded):  # noqa: F811
    with_ckpt, core, kinds = run_turns(loaded, 256 * MIB, conversations=1, turns=3)
    without, plain, plain_kinds = run_turns(loaded, 0, conversations=1, turns=3)
    assert with_ckpt == without
    stats = core.checkpoints.stats
    assert stats.restores == 2 and stats.hits == 2 and stats.restored_tokens > 0
    assert GraphKind.RESTORE in kinds and GraphKind.SNAPSHOT in kinds
    assert GraphKind.RESTORE not in plain_kinds and GraphKind.SNAPSHOT not in plain_kinds
    # Restored tokens were not prefilled again: fewer prefill executions than without checkpoints.
    assert kinds.count(GraphKind.PREFILL) < plain_kinds.count(GraphKind.PREFILL)
    assert core.checkpoints.guarded() == 0 and sorted(core._free_slots) == [0, 1]


def test_eviction_under_pressure_loses_no_request(loaded):  # noqa: F811
    # Room for about one conversation's state: later snapshots evict earlier ones.
    per_token = 2 * loaded.config.n_layers * loaded.config.n_kv_heads * loaded.config.head_dim * 4
    replies, core, kinds = run_turns(loaded, 60 * per_token, conversations=3, turns=2)
    reference, _, _ = run_turns(loaded, 0, conversations=3, turns=2)
    assert replies == reference
    stats = core.checkpoints.stats
    assert stats.evictions + stats.skipped_snapshots > 0 and stats.misses > 0
    assert core.checkpoints.used_bytes <= core.checkpoints.capacity_bytes
    assert core.checkpoints.guarded() == 0 and not core.requests and sorted(core._free_slots) == [0, 1]


def test_cancelled_restore_keeps_then_drops_its_guard(loaded):  # noqa: F811
    _, core, _ = run_turns(loaded, 256 * MIB, conversations=1, turns=1)
    tok = core.tokenizer
    driver = SyncDriver(Scheduler(core.catalog, config=core.scheduler_config()), core)
    (entry,) = core.checkpoints._entries.values()
    messages = [{"role": "user", "content": f"{QUESTIONS[0]} Turn 0."},
                {"role": "assistant", "content": tok.decode([t for t in entry.tokens.tolist()][-3:])},
                {"role": "user", "content": "And another?"}]
    ids, ends = prompt_of(tok, messages)
    h = driver.submit(ids, 4, ends, temperature=0.0)
    assert core.checkpoints.guarded() == 1 and h in core.pending_restores
    # A restore in flight keeps its row: commit it, cancel, then let the fence complete.
    plan = driver.commit()
    assert plan.shape.kind is GraphKind.RESTORE
    driver.cancel(h)
    assert h in core.requests  # still owned through its last fence
    driver.finish_frames()
    assert core.checkpoints.guarded() == 0 and not core.requests and sorted(core._free_slots) == [0, 1]
    assert core.checkpoints.stats.restores == 1


def test_cancel_before_restore_releases_the_guard(loaded):  # noqa: F811
    _, core, _ = run_turns(loaded, 256 * MIB, conversations=1, turns=1)
    driver = SyncDriver(Scheduler(core.catalog, config=core.scheduler_config()), core)
    (entry,) = core.checkpoints._entries.values()
    ids = entry.tokens.tolist() + core.tokenizer.encode("<|im_end|>\nmore")
    h = driver.submit(ids, 4, (len(entry.tokens),), temperature=0.0)
    assert core.checkpoints.guarded() == 1
    driver.cancel(h)
    assert core.checkpoints.guarded() == 0 and not core.requests


@pytest.mark.parametrize("options", [dict(temperature=0.0), dict(temperature=0.8, seed=7)])
def test_preempted_request_resumes_with_the_same_tokens(loaded, options):  # noqa: F811
    tok = loaded.tokenizer
    ids, ends = prompt_of(tok, [{"role": "user", "content": "Count from one to twenty."}])
    outs = []
    for preempt in (False, True):
        core, driver = core_and_driver(loaded, 64 * MIB)
        h = driver.submit(ids, 10, ends, ignore_eos=True, **options)
        other = driver.submit(ids[:-3] + ids[-2:], 4, (), temperature=0.0)  # shares the machine
        if preempt:
            while driver.scheduler.request_row(h).output_done < 3:
                driver.step()
            driver.scheduler.preempt(h, driver.now())
        driver.run()
        kinds = [p.shape.kind for p in driver.history if h in p.handles]
        assert (GraphKind.RESTORE in kinds) == preempt
        assert driver.requests[other].finish is not None
        outs.append(driver.requests[h].tokens)
        assert not core.requests and not core.resumable and sorted(core._free_slots) == [0, 1]
    assert outs[0] == outs[1] and len(outs[0]) == 10


def test_threaded_runtime_restores_a_continued_chat(loaded):  # noqa: F811
    """The server's runtime: turn 2 of a chat restores turn 1's terminal capture, and its text
    equals a run without checkpoints; the held finish still ends each stream."""
    from helios.runtime.runtime import Runtime
    from helios.runtime.stream import SamplingParams

    texts = []
    for memory in (64 * MIB, 0):
        core, _ = core_and_driver(loaded, memory)
        tok = core.tokenizer
        scheduler = Scheduler(core.catalog, config=core.scheduler_config())
        messages = [{"role": "user", "content": "Name a planet."}]
        out = []
        with Runtime(scheduler, core, tokenizer=tok) as runtime:
            for turn in range(2):
                ids, ends = prompt_of(tok, messages)
                stream = runtime.submit(ids, SamplingParams(max_tokens=6, temperature=0.0, endpoints=ends))
                text = "".join(e.text for e in stream)
                assert stream.finish_reason in ("stop", "length")
                out.append(text)
                messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "Another one?"}]
            assert runtime.wait_idle(30)
        texts.append(out)
        if memory:
            assert core.checkpoints.stats.restores == 1 and core.checkpoints.guarded() == 0
    assert texts[0] == texts[1]


def test_message_endpoints_are_exact_token_boundaries(loaded):  # noqa: F811
    tok = loaded.tokenizer
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there."},
                {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Name a color."}]
    ids, ends = prompt_of(tok, messages)
    assert len(ends) == 4 and list(ends) == sorted(set(ends)) and 0 < ends[0] and ends[-1] < len(ids)
    for i, e in enumerate(ends):  # each endpoint is the token count of the conversation up to message i
        head = tok.encode(tok.apply_chat_template(messages[: i + 1], add_generation_prompt=False))
        assert ids[:e] == head


def test_automatic_preemption_gives_the_tokens_of_an_uninterrupted_run(loaded):  # noqa: F811
    """Two long generations hold both slots; a short request arrives. With the automatic policy
    (helios/scheduler/preemption.py) a long one is paused for it and restored later, and every
    request's tokens equal those of a run without preemption."""
    import dataclasses

    from helios.config import PreemptionConfig, PreemptionPolicy

    tok = loaded.tokenizer
    asks = ("Count from one to twenty.", "List the days of the week.", "Name a color.")
    prompts = [prompt_of(tok, [{"role": "user", "content": q}])[0] for q in asks]
    runs = []
    for policy in (PreemptionPolicy.OFF, PreemptionPolicy.PRICE):
        core = TorchCore(loaded=loaded, request_slots=2, max_context=384, prefill_chunks=(64,), max_batch=2,
                         checkpoint_memory=64 * MIB)
        config = dataclasses.replace(core.scheduler_config(), preemption=PreemptionConfig(
            policy, price_ratio=1.0, quantum_ms=0.0))
        driver = SyncDriver(Scheduler(core.catalog, config=config), core)
        longs = [driver.submit(p, 16, ignore_eos=True, temperature=0.0) for p in prompts[:2]]
        while any(driver.scheduler.request_row(h).output_done < 2 for h in longs):
            driver.step()
        short = driver.submit(prompts[2], 3, ignore_eos=True, temperature=0.0)
        driver.run()
        restored = {h for p in driver.history if p.shape.kind is GraphKind.RESTORE for h in p.handles}
        assert bool(restored & set(longs)) == (policy is PreemptionPolicy.PRICE)
        if restored:  # the short request finished before the long one it paused
            assert all(driver.requests[short].finished_ns < driver.requests[h].finished_ns for h in restored)
        runs.append([driver.requests[h].tokens for h in longs + [short]])
        assert not core.requests and not core.resumable and sorted(core._free_slots) == [0, 1]
    assert runs[0] == runs[1] and [len(t) for t in runs[0]] == [16, 16, 3]

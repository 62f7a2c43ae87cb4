"""Multi-turn prefix reuse on the real model: checkpoints on against off, in one run.

Workload: C conversations of K turns (default 8 x 4). Turn 1 is a system message and a user
message carrying a ~250-token document; turns 2..K extend the conversation: the previous
turns, their assistant replies (as the client saw them) and a new short question. Each
conversation is a closed loop: its next turn is submitted as soon as its previous one finished,
and all C conversations run at once through the synchronous driver (helios.runtime.driver) on
the monotonic clock. Greedy, `--tokens` output tokens at most.

- on:  TorchCore with a checkpoint store (--checkpoint-memory MiB). A finished turn retires
       through a terminal SNAPSHOT; the next turn matches the stored prefix at admission and
       runs a RESTORE before prefilling only the new suffix.
- off: the same core without a store: every turn prefills its whole conversation.

Both sides start from the server's warm-up (helios.server.warmup), so costs are measured.
Printed: later-turn (2..K) TTFT p50/p99 per mode and their ratio, first-turn TTFT, prompt tokens
actually prefilled, restored tokens, checkpoint counters, graph counts, and whether every reply
is token-identical across the two modes.
Bar: later-turn TTFT p50 (on) <= 0.5 x (off), with identical tokens.

Run: .venv/bin/python bench/prefix_reuse.py [--conversations 8] [--turns 4] [--tokens 16]

Shared system prompt (--shared-system): C conversations share one long system message (the
~250-token document) and each sends ONE turn with its own question. They arrive one after the
other: conversation i+1 is submitted when conversation i has published its first token (so it
arrives while i is still decoding, before i's terminal capture exists). Three modes in one run:
- anchors:  checkpoints on with the default extra-work fraction (0.05): prefill is cut at the
            message endpoints the allowance funds and each cut is snapshotted as an anchor;
- terminal: checkpoints on with fraction 0 (only terminal captures, as before anchor cuts);
- off:      no checkpoint store.
Printed: first-turn TTFT p50 (all but the first conversation, which can reuse nothing), prompt
tokens prefilled, anchor snapshots, checkpoint counters, and token identity across the modes.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import Counter

import torch

from helios.engine.torch_core import TorchCore, load_model
from helios.runtime.driver import SyncDriver
from helios.scheduler import Scheduler
from helios.server.anchors import message_endpoints
from helios.server.warmup import WarmupConfig, warm_up

TOPICS = ["the ocean", "volcanoes", "honey bees", "the moon", "rain forests", "glaciers", "deserts", "comets"]
QUESTIONS = ["Summarize it in one sentence.", "What is the most surprising fact?", "Give it a short title.",
             "Who would enjoy reading it?", "Name one related topic."]


def document(topic: str) -> str:
    # Deterministic filler of ~250 tokens: the long shared prefix every later turn extends.
    lines = [f"Note {i} about {topic}: {topic} have been studied for many years, and scientists keep "
             f"finding new details about how {topic} change over time." for i in range(8)]
    return "Here is a document.\n" + "\n".join(lines)


def percentile(values, q):
    v = sorted(values)
    return v[min(len(v) - 1, int(round(q * (len(v) - 1))))] if v else float("nan")


def run(loaded, memory_mib: int, args) -> dict:
    core = TorchCore(loaded=loaded, request_slots=args.slots, max_context=args.max_context, prefill_chunks=(64, 256),
                     max_batch=args.slots, checkpoint_memory=memory_mib << 20)
    scheduler = Scheduler(core.catalog, config=core.scheduler_config())
    warm_up(scheduler, core, WarmupConfig(rounds=2, budget_s=15.0))
    driver = SyncDriver(scheduler, core)
    tok = core.tokenizer
    convs = [[{"role": "system", "content": "You are a helpful assistant."},
              {"role": "user", "content": document(TOPICS[c % len(TOPICS)])}] for c in range(args.conversations)]
    turn_of, conv_of, replies = {}, {}, [[] for _ in convs]
    ttft = {1: [], 2: []}  # 1: first turns, 2: later turns

    def submit(c: int, turn: int) -> int:
        text = tok.apply_chat_template(convs[c], add_generation_prompt=True)
        ids = tok.encode(text)
        h = driver.submit(ids, args.tokens, message_endpoints(tok, convs[c], text, ids), temperature=0.0)
        turn_of[h], conv_of[h] = turn, c
        return h

    start = time.perf_counter()
    for c in range(len(convs)):
        submit(c, 1)
    pending = set(turn_of)
    while pending:
        if not driver.step():
            raise RuntimeError("stalled")
        for h in [h for h in pending if driver.requests[h].finish is not None]:
            pending.discard(h)
            r, c, turn = driver.requests[h], conv_of[h], turn_of[h]
            if r.first_token_ns is not None:
                ttft[1 if turn == 1 else 2].append((r.first_token_ns - r.admitted_ns) / 1e6)
            out = [t for t in r.tokens if t != tok.eos_id]
            replies[c].append(tuple(r.tokens))
            if turn < args.turns:
                convs[c] += [{"role": "assistant", "content": tok.decode(out)},
                             {"role": "user", "content": QUESTIONS[(c + turn) % len(QUESTIONS)]}]
                pending.add(submit(c, turn + 1))
    wall = time.perf_counter() - start
    plans = driver.history
    return dict(
        wall=wall, ttft=ttft, replies=replies,
        prefilled=sum(int(p.lanes.prompt_tokens.sum()) for p in plans),
        prompt_total=sum(len(r.prompt) for r in driver.requests.values()),
        graphs=Counter(p.shape.kind.value for p in plans),
        store=None if core.checkpoints is None else core.checkpoints.stats.as_dict())


def run_shared(loaded, memory_mib: int, fraction: float, args) -> dict:
    core = TorchCore(loaded=loaded, request_slots=args.slots, max_context=args.max_context, prefill_chunks=(64, 256),
                     max_batch=args.slots, checkpoint_memory=memory_mib << 20)
    scheduler = Scheduler(core.catalog, config=core.scheduler_config(checkpoint_extra_work_fraction=fraction))
    warm_up(scheduler, core, WarmupConfig(rounds=2, budget_s=15.0))
    driver = SyncDriver(scheduler, core)
    tok = core.tokenizer
    system = {"role": "system", "content": document("the ocean")}
    convs = [[system, {"role": "user", "content": f"Question {c}: {QUESTIONS[c % len(QUESTIONS)]} "
                                                  f"Relate it to {TOPICS[c % len(TOPICS)]}."}]
             for c in range(args.conversations)]
    handles = []

    def submit(c: int) -> None:
        text = tok.apply_chat_template(convs[c], add_generation_prompt=True)
        ids = tok.encode(text)
        handles.append(driver.submit(ids, args.tokens, message_endpoints(tok, convs[c], text, ids), temperature=0.0))

    start = time.perf_counter()
    submit(0)
    while any(driver.requests[h].finish is None for h in handles) or len(handles) < len(convs):
        if len(handles) < len(convs) and driver.requests[handles[-1]].first_token_ns is not None:
            submit(len(handles))  # the next conversation arrives once the previous one answered
            continue
        if not driver.step():
            raise RuntimeError("stalled")
    wall = time.perf_counter() - start
    reqs = [driver.requests[h] for h in handles]
    plans = driver.history
    return dict(
        wall=wall, ttft=[(r.first_token_ns - r.admitted_ns) / 1e6 for r in reqs[1:]],
        replies=[tuple(r.tokens) for r in reqs],
        prefilled=sum(int(p.lanes.prompt_tokens.sum()) for p in plans),
        prompt_total=sum(len(r.prompt) for r in reqs),
        anchors=sum(len(p.lanes) for p in plans if p.anchor),
        graphs=Counter(p.shape.kind.value for p in plans),
        store=None if core.checkpoints is None else core.checkpoints.stats.as_dict())


def main_shared(loaded, args) -> None:
    modes = {"anchors": (args.checkpoint_memory, 0.05), "terminal": (args.checkpoint_memory, 0.0), "off": (0, 0.05)}
    results = {m: run_shared(loaded, mem, frac, args) for m, (mem, frac) in modes.items()}
    print(f"shared system prompt: {args.conversations} conversations x 1 turn, {args.tokens} output tokens, "
          f"{args.slots} slots, torch threads {torch.get_num_threads()}")
    print(f"{'mode':9} {'TTFT p50':>10} {'prefilled':>10} {'of prompt':>10} {'anchors':>8} {'wall s':>7}  graphs")
    for mode, r in results.items():
        print(f"{mode:9} {statistics.median(r['ttft']):7.0f} ms {r['prefilled']:10d} {r['prompt_total']:10d} "
              f"{r['anchors']:8d} {r['wall']:7.1f}  {dict(r['graphs'])}")
        if r["store"] is not None:
            print(f"          store: {r['store']}")
    a, off = results["anchors"], results["off"]
    print(f"TTFT p50 ratio anchors/off: {statistics.median(a['ttft']) / statistics.median(off['ttft']):.2f}, "
          f"terminal/off: {statistics.median(results['terminal']['ttft']) / statistics.median(off['ttft']):.2f}; "
          f"identical tokens: {a['replies'] == off['replies'] == results['terminal']['replies']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--conversations", type=int, default=8)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--max-context", type=int, default=1024)
    ap.add_argument("--checkpoint-memory", type=int, default=2048, metavar="MIB")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--shared-system", action="store_true",
                    help="one-turn conversations sharing a long system prompt (anchor cuts)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load_model()
    if args.shared_system:
        return main_shared(loaded, args)
    results = {"on": run(loaded, args.checkpoint_memory, args), "off": run(loaded, 0, args)}
    print(f"{args.conversations} conversations x {args.turns} turns, {args.tokens} output tokens, "
          f"{args.slots} slots, torch threads {torch.get_num_threads()}")
    print(f"{'mode':5} {'later TTFT p50':>15} {'p99':>9} {'first TTFT p50':>15} {'prefilled':>10} "
          f"{'of prompt':>10} {'wall s':>7}  graphs")
    for mode, r in results.items():
        later, first = r["ttft"][2], r["ttft"][1]
        print(f"{mode:5} {statistics.median(later):12.0f} ms {percentile(later, 0.99):6.0f} ms "
              f"{statistics.median(first):12.0f} ms {r['prefilled']:10d} {r['prompt_total']:10d} "
              f"{r['wall']:7.1f}  {dict(r['graphs'])}")
    on, off = results["on"], results["off"]
    ratio = statistics.median(on["ttft"][2]) / statistics.median(off["ttft"][2])
    identical = on["replies"] == off["replies"]
    print(f"checkpoint store: {on['store']}")
    print(f"later-turn TTFT p50 ratio on/off: {ratio:.2f} (bar <= 0.5); identical tokens: {identical}")


if __name__ == "__main__":
    main()

"""The real model on this CPU: Helios (Scheduler + TorchCore) against sequential generation.

Workload: N chat-templated prompts (about 40-60 tokens each), greedy, `--tokens` output tokens
at most (EOS may end a request earlier; both sides then produce the same tokens).

- Sequential: one request at a time, the model package's plain loop (whole-prompt prefill, then
  one batch-1 decode per token) on the same model and thread count: no scheduler, no padding.
- Helios at concurrency c: a closed loop keeps c requests in flight (a new one is admitted as
  soon as one finishes) through the synchronous driver on the monotonic clock, with the default
  (balanced) policy. The scheduler learns every graph cost from TorchCore's measured intervals;
  its cost table starts from TorchCore.warmup()'s measurement of each prepared graph, so the
  run is past graph discovery. c = 16 uses request_slots = max_batch = 16.
- The load on a shared machine drifts, so the sequential rate is measured in two halves, one
  before and one after the Helios runs, and combined.

Printed: useful (output) tokens/s and its ratio to sequential, prompt+output tokens/s, mean and
p50 time to first token (admission to first token), and the graphs Helios ran.
Target: >= 4x sequential output throughput at concurrency 16.

Run: .venv/bin/python bench/engine_throughput.py [--tokens 32] [--requests 16] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import Counter

import torch

from helios.config import PolicyConfig
from helios.engine.model import KVCache
from helios.engine.torch_core import TorchCore, load_model
from helios.runtime.driver import SyncDriver
from helios.scheduler import Scheduler

QUESTIONS = [
    "What is the capital of France?", "Name three colors.", "Write a haiku about the sea.",
    "Why is the sky blue?", "Give me a tip for learning to cook.", "What is a prime number?",
    "Describe a cat in one sentence.", "How do plants make food?", "What is the tallest mountain?",
    "Suggest a name for a pet fish.", "Explain what a computer does.", "What is rain made of?",
    "List two fruits that are red.", "Who wrote Romeo and Juliet?", "What do bees make?",
    "How many legs does a spider have?", "What is the boiling point of water?",
    "Tell me a fun fact about the moon.", "What is the opposite of hot?", "Why do we sleep?",
]
MAX_CONTEXT = 256


def prompts(tok, n):
    chats = [[{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}] for i in range(n)]
    return [tok.encode(tok.apply_chat_template(c)) for c in chats]


def sequential(loaded, workload, tokens):
    """One request at a time: whole-prompt prefill, then batch-1 greedy decode steps."""
    model, eos = loaded.model, loaded.tokenizer.eos_id
    cache, slot = KVCache(loaded.config, 1, MAX_CONTEXT), torch.tensor([0])
    outputs, ttft = [], []
    start = time.perf_counter()
    for ids in workload:
        t0 = time.perf_counter()
        toks, pos, out = torch.tensor([ids]), torch.arange(len(ids))[None], []
        while True:
            logits = model(toks, pos, slot, cache, logits_at=torch.tensor([toks.shape[1] - 1]))
            out.append(int(logits[0, -1].argmax()))
            if len(out) == 1:
                ttft.append(time.perf_counter() - t0)
            if out[-1] == eos or len(out) == tokens:
                break
            toks, pos = torch.tensor([[out[-1]]]), pos[:, -1:] + 1
        outputs.append(out)
    return outputs, time.perf_counter() - start, ttft


def helios(loaded, workload, tokens, concurrency):
    core = TorchCore(loaded=loaded, request_slots=concurrency, max_batch=concurrency,
                     max_context=MAX_CONTEXT)
    scheduler = Scheduler(core.catalog, PolicyConfig(), core.scheduler_config())
    driver = SyncDriver(scheduler, core)
    scheduler.seed_costs({shape: [ns] for shape, ns in core.warmup().items()}, driver.now())
    queue, handles = list(workload), []
    start = time.monotonic_ns()
    while queue or scheduler.snapshot().live:
        while queue and scheduler.snapshot().live < concurrency:
            handles.append(driver.submit(queue.pop(0), tokens))
        driver.step()
    elapsed = (time.monotonic_ns() - start) / 1e9
    reqs = [driver.requests[h] for h in handles]
    ttft = [(r.first_token_ns - r.admitted_ns) / 1e9 for r in reqs]
    graphs = Counter(p.shape.label() for p in driver.history)
    return [r.tokens for r in reqs], elapsed, ttft, graphs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--levels", default="1,4,16")
    # One thread by default: on a shared 2-core box two OpenMP threads slow down 5-10x whenever
    # another process holds a core. 0 keeps torch's default.
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    loaded = load_model()
    print(f"model loaded in {time.perf_counter() - t0:.1f} s; torch threads {torch.get_num_threads()}")
    workload = prompts(loaded.tokenizer, args.requests)
    prompt_tokens = sum(map(len, workload))

    half = len(workload) // 2
    ref, seq_s, seq_ttft = sequential(loaded, workload[:half], args.tokens)
    rows = []
    for c in (int(x) for x in args.levels.split(",")):
        rows.append((c, *helios(loaded, workload, args.tokens, c)))
    ref2, seq_s2, seq_ttft2 = sequential(loaded, workload[half:], args.tokens)
    ref, seq_s, seq_ttft = ref + ref2, seq_s + seq_s2, seq_ttft + seq_ttft2
    seq_out = sum(map(len, ref))
    seq_rate = seq_out / seq_s
    print(f"\n{args.requests} requests, {prompt_tokens} prompt tokens, <= {args.tokens} output tokens each")
    print(f"{'':>12} {'out tok/s':>10} {'ratio':>6} {'all tok/s':>10} {'TTFT mean':>10} {'TTFT p50':>9}  same tokens")
    print(f"{'sequential':>12} {seq_rate:10.1f} {1.0:6.2f} {(seq_out + prompt_tokens) / seq_s:10.1f} "
          f"{statistics.mean(seq_ttft):9.3f}s {statistics.median(seq_ttft):8.3f}s")
    for c, outs, secs, ttft, graphs in rows:
        n = sum(map(len, outs))
        print(f"{f'helios c={c}':>12} {n / secs:10.1f} {n / secs / seq_rate:6.2f} "
              f"{(n + prompt_tokens) / secs:10.1f} {statistics.mean(ttft):9.3f}s "
              f"{statistics.median(ttft):8.3f}s  {sum(a == b for a, b in zip(outs, ref))}/{len(ref)}")
        print(f"{'':>12} graphs: " + ", ".join(f"{k} x{v}" for k, v in sorted(graphs.items())))


if __name__ == "__main__":
    main()

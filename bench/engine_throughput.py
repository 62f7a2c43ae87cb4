"""The real model on this CPU: Helios (Scheduler + TorchCore) against sequential generation.

Workload: N chat-templated prompts (about 40-60 tokens each), greedy, `--tokens` output tokens
at most (EOS may end a request earlier; both sides then produce the same tokens).

- Sequential: one request at a time, the model package's plain loop (whole-prompt prefill, then
  one batch-1 decode per token) on the same model and thread count: no scheduler, no padding.
- Helios at concurrency c: a closed loop keeps c requests in flight (a new one is admitted as
  soon as one finishes) through the synchronous driver on the monotonic clock, with the default
  (balanced) policy. The scheduler learns every graph cost from TorchCore's measured intervals;
  its cost table starts from the server's warm-up (helios.server.warmup) of each prepared graph, so the
  run is past graph discovery. c = 16 uses request_slots = max_batch = 16.
- The load on a shared machine drifts, so the sequential rate is measured in two halves, one
  before and one after the Helios runs, and combined.

Printed: useful (output) tokens/s and its ratio to sequential, prompt+output tokens/s, mean and
p50 time to first token (admission to first token), and the graphs Helios ran.
Target: >= 4x sequential output throughput at concurrency 16.

Mixed-load row (issue 10): 8 decode streams run; once each has produced a few tokens, a long prompt
(~1100 tokens) arrives. Helios runs it twice in one process, with and without the mixed catalog
(`flare run --mixed-prefill`): the decoders' p99 inter-token gap (from the long prompt's arrival to
the end: without mixed graphs every prompt chunk stalls every decoder), the long prompt's TTFT, and
total (output) tokens/s over the whole row.

Measured (2026-12-01, `--mixed-load-only --tokens 48`, one torch thread, the shared 2-core box at load
average 15-19, a 1172-token prompt, two runs):
                        gap p99   long TTFT   out tok/s   mixed graphs chosen
  run 1  helios          14.1 s      71.4 s         2.3
         --mixed-prefill  8.7 s      41.9 s         2.8     2 of 128
  run 2  helios           5.5 s      55.6 s         3.2
         --mixed-prefill 11.9 s      47.7 s         2.6     2 of 109
Quiet machine (2026-12-01 19:30 UTC, load average 0.2-1.0, after the issue-12 time-scaled prices), two runs:
                        gap p99   long TTFT   out tok/s   mixed graphs chosen
  run 1  helios          0.78 s      16.8 s        13.3
         --mixed-prefill  1.19 s      16.9 s        13.4     2 of 75
  run 2  helios          0.84 s      17.8 s        12.6
         --mixed-prefill  1.28 s      18.8 s        12.1     3 of 75
On a quiet machine the sign is stable: mixed graphs do not help on this CPU (decoders' gap p99 1.5x worse,
TTFT and throughput within noise). Under load (above) the two runs disagreed in sign: the row was dominated
by the machine's load, and the scheduler chose mixed
graphs twice per run, because on this CPU a mixed graph costs about its prefill plus its decode graph
(timed directly: mixed[B=16,W=1,C=256] with 15 decode rows 6.7-7.0 s against prefill[B=1,C=256] 5.7-6.1 s
plus decode[B=16] 1.0-1.1 s; the packed extent adds 15 positions to a compute-bound prefill, and a CPU decode
graph is not weight-bandwidth-bound enough for the shared weight pass to save much). Mixed graphs are
therefore not the default for `flare run`.

Run: .venv/bin/python bench/engine_throughput.py [--tokens 32] [--requests 16] [--threads 1]
     [--levels 1,4,16] [--mixed-load-only]
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
from helios.server.warmup import warm_up

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
    warm_up(scheduler, core)  # the server's steady-state warm-up, seeded through seed_costs
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


LONG_CONTEXT = 1536
LONG_TOPICS = ["the water cycle", "photosynthesis", "plate tectonics", "the history of the printing press",
               "how vaccines work", "the life cycle of stars", "ocean currents", "how bridges carry loads"]


def long_prompt(tok, target=1100):
    """A chat prompt of about `target` tokens (topic sentences repeated)."""
    text, n = "", 0
    while n < target:
        text += " ".join(f"Summarize what you know about {t}, in plain words." for t in LONG_TOPICS) + " "
        n = len(tok.encode(tok.apply_chat_template([{"role": "user", "content": text}])))
    return tok.encode(tok.apply_chat_template([{"role": "user", "content": text}]))


def mixed_load(loaded, decoders, long_ids, tokens, mixed):
    """8 decode streams, then the long prompt: (decoder gap p99 s, long TTFT s, out tok/s, graphs)."""
    core = TorchCore(loaded=loaded, request_slots=16, max_batch=16, max_context=LONG_CONTEXT,
                     prefill_chunks=(64, 256), mixed_prefill=mixed)
    scheduler = Scheduler(core.catalog, PolicyConfig(), core.scheduler_config())
    driver = SyncDriver(scheduler, core)
    warm_up(scheduler, core)
    start = time.monotonic_ns()
    handles = [driver.submit(ids, tokens) for ids in decoders]
    # The long prompt arrives once every decoder is streaming (a few tokens each).
    while min(len(driver.requests[h].tokens) for h in handles) < 4:
        driver.step()
    arrival = time.monotonic_ns()
    long_handle = driver.submit(long_ids, 8)
    seen = {h: len(driver.requests[h].tokens) for h in handles}
    last = {h: arrival for h in handles}
    gaps = []
    while scheduler.snapshot().live:
        driver.step()
        now = time.monotonic_ns()
        for h in handles:  # a decoder's gap: between two steps that gave it tokens
            n = len(driver.requests[h].tokens)
            if n > seen[h]:
                gaps.append((now - last[h]) / 1e9)
                seen[h], last[h] = n, now
    elapsed = (time.monotonic_ns() - start) / 1e9
    out = sum(len(r.tokens) for r in driver.requests.values())
    req = driver.requests[long_handle]
    graphs = Counter(p.shape.label() for p in driver.history)
    p99 = statistics.quantiles(gaps, n=100)[98] if len(gaps) > 1 else float("nan")
    return p99, (req.first_token_ns - req.admitted_ns) / 1e9, out / elapsed, graphs


def print_mixed_load(loaded, tokens):
    tok = loaded.tokenizer
    decoders = prompts(tok, 8)
    long_ids = long_prompt(tok)
    print(f"\nmixed load: 8 decode streams (<= {tokens} tokens), then a {len(long_ids)}-token prompt")
    print(f"{'':>22} {'gap p99':>9} {'long TTFT':>10} {'out tok/s':>10}")
    for mixed in (False, True):
        p99, ttft, rate, graphs = mixed_load(loaded, decoders, long_ids, tokens, mixed)
        label = "helios --mixed-prefill" if mixed else "helios"
        print(f"{label:>22} {p99:8.3f}s {ttft:9.3f}s {rate:10.1f}")
        print(f"{'':>22} graphs: " + ", ".join(f"{k} x{v}" for k, v in sorted(graphs.items())))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--levels", default="1,4,16")
    # One thread by default: on a shared 2-core box two OpenMP threads slow down 5-10x whenever
    # another process holds a core. 0 keeps torch's default.
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--mixed-load-only", action="store_true", help="only the mixed-load row")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    loaded = load_model()
    print(f"model loaded in {time.perf_counter() - t0:.1f} s; torch threads {torch.get_num_threads()}")
    if args.mixed_load_only:
        print_mixed_load(loaded, args.tokens)
        return
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
    print_mixed_load(loaded, args.tokens)


if __name__ == "__main__":
    main()

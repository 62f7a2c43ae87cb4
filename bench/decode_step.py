"""One decode step of the `--weights gguf` model, timed for several settings in turn, to measure a
change against the old path under whatever load the machine has.

Each setting is a worker process (its own torch, model and KV cache) that builds the model once and
then times steps on request; the parent asks the settings in turn for --passes passes, so drifting
load from other jobs hits all of them alike, and prints per setting the minimum and median over
passes of each pass's median, and each setting's ratio to the first (old / new: >1 means faster).

Settings, given as TREE[:HEAD] (repeatable --setting):
- TREE: a source tree to import helios from ('.' = this one; e.g. a `git worktree` of main, to time
  the old code);
- HEAD: 'tree' (the tree's own LM head, the default) or 'fp32' (the file's weights dequantized to
  float32 in oneDNN's packed linear: the head before helios.engine.model.head).
The step: B rows (--rows) of one token each at KV position --position after real text, logits at
every row (what a prepared decode graph computes), --threads torch threads.

Run: .venv/bin/python bench/decode_step.py --setting .:fp32 --setting . [--rows 1,4] [--passes 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

TEXT = ("The printing press, developed by Johannes Gutenberg around 1440, combined movable metal type, "
        "oil-based ink and a screw press adapted from wine making. It made books cheaper and spread literacy. ")


def worker(head: str, threads: int, rows: list[int], position: int, repeats: int) -> None:
    import torch

    from helios.engine.model import KVCache, LlamaModel, Tokenizer, WeightFormat, load_weights
    from helios.engine.model.loader import load_quantized
    from helios.engine.model.weights import Linear

    torch.set_num_threads(threads)
    config, weights = load_weights()
    model = LlamaModel(config, weights, weight_format=WeightFormat.GGUF, quantized=load_quantized())
    if head == "fp32":
        model.output = Linear(weights["token_embd.weight" if config.tie_embeddings else "output.weight"])
    cache = KVCache(config, max(rows) + 1, position + 64)
    window = -(-(position + 1) // 64) * 64
    # Real text in every row's cache, so the step's logits are a language model's (the head's
    # rescoring depends on how peaked they are): rows 0..B-1 hold TEXT's first `position` tokens.
    ids = Tokenizer.from_gguf().encode(TEXT * (2 + position // 20))[:position]
    with torch.inference_mode():
        for b in range(max(rows)):
            model(torch.tensor([ids]), torch.arange(position)[None], torch.tensor([b]), cache)
        nxt = model(torch.tensor([ids]), torch.arange(position)[None], torch.tensor([max(rows)]), cache,
                    logits_at=torch.tensor([position - 1])).argmax()

    def step(b: int) -> float:
        tokens = torch.full((b, 1), int(nxt))
        start = time.perf_counter()
        model(tokens, torch.full((b, 1), position), torch.arange(b), cache, kv_window=window,
              logits_at=torch.zeros(b, dtype=torch.long)).argmax(-1)
        return time.perf_counter() - start

    with torch.inference_mode():
        for b in rows:
            step(b)
        print("ready", flush=True)
        for _ in sys.stdin:  # one line per pass
            out = {b: statistics.median(step(b) for _ in range(repeats)) for b in rows}
            print(json.dumps(out), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--setting", action="append", help="TREE[:HEAD], HEAD tree or fp32 (repeatable)")
    ap.add_argument("--rows", default="1,4", help="decode rows per step, comma-separated")
    ap.add_argument("--position", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--passes", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=5, help="steps per pass (their median is the pass's)")
    ap.add_argument("--worker", nargs=2, metavar=("HEAD", "ROWS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        head, rows = args.worker
        return worker(head, args.threads, [int(r) for r in rows.split(",")], args.position, args.repeats)
    settings = args.setting or [".:fp32", "."]
    procs = {}
    for s in settings:
        tree, _, head = s.partition(":")
        env = {**os.environ, "PYTHONPATH": os.path.abspath(tree)}
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", head or "tree", args.rows,
               "--threads", str(args.threads), "--position", str(args.position), "--repeats", str(args.repeats)]
        procs[s] = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    for p in procs.values():
        assert p.stdout.readline().strip() == "ready"
    print(f"load average at start: {os.getloadavg()[0]:.2f}; threads {args.threads}, position {args.position}",
          flush=True)
    times: dict[str, list[dict]] = {s: [] for s in settings}
    for _ in range(args.passes):
        for s, p in procs.items():  # settings in turn, one pass each
            p.stdin.write("go\n")
            p.stdin.flush()
            times[s].append(json.loads(p.stdout.readline()))
    for p in procs.values():
        p.stdin.close()
        p.wait(60)
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    for b in args.rows.split(","):
        first = min(t[b] for t in times[settings[0]])
        cells = []
        for s in settings:
            per = [t[b] for t in times[s]]
            cells.append(f"{s}: min {min(per) * 1e3:.2f} ms, median {statistics.median(per) * 1e3:.2f} ms "
                         f"({first / min(per):.2f}x)")
        print(f"B={b}: " + "; ".join(cells))


if __name__ == "__main__":
    main()

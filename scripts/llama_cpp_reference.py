"""Record llama.cpp's answers on the embedded GGUF: the reference `--weights gguf` is checked against
(tests/model/test_llama_cpp_agreement.py reads the file this writes; llama.cpp need not be installed
to run the tests).

It starts the given `llama-server` on the GGUF (one slot, two threads), and records
- greedy continuations (temperature 0, top-k 1) of the chat prompts below, as token ids, from
  prompt token ids made by Helios's own tokenizer and chat template (so both sides see the same
  tokens), and llama.cpp's own tokenization of each templated prompt, for comparison;
- perplexity on data/perplexity_text.txt: llama.cpp's tokenization of it (/tokenize, with BOS if
  the vocabulary adds one) and `llama-perplexity -c 128 -b 128` on the same file. llama-perplexity
  splits the tokens into chunks of n_ctx, starts each chunk with BOS where the vocabulary adds one,
  and scores the second half of each chunk; tests/model/test_llama_cpp_agreement.py does the same.

Run (binaries built as in docs/server.md, "Benchmark"):
    .venv/bin/python scripts/llama_cpp_reference.py --server build/bin/llama-server \
        --perplexity build/bin/llama-perplexity [--port 18460] [--out data/llama_cpp_reference.json]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import subprocess
import time

import httpx

from helios.engine.model import Tokenizer, default_model_path

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROMPTS = ["What is the capital of France?", "Name three colors.", "Write a haiku about the sea.",
           "Why is the sky blue?", "Give me a tip for learning to cook.", "What is a prime number?",
           "Describe a cat in one sentence.", "How do plants make food?", "What is 12 times 12?",
           "Translate 'good morning' into Spanish.", "List the planets of the solar system.",
           "What does a compiler do?"]
TOKENS = 32  # greedy tokens per prompt
PPL_CTX = 128  # llama-perplexity -c


def wait_ready(url: str, proc: subprocess.Popen) -> None:
    for _ in range(600):
        if proc.poll() is not None:
            raise SystemExit(f"llama-server exited with {proc.returncode}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit("llama-server did not become ready")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--server", required=True, help="path of llama.cpp's llama-server")
    ap.add_argument("--perplexity", required=True, help="path of llama.cpp's llama-perplexity")
    ap.add_argument("--port", type=int, default=18460)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--text", default=str(ROOT / "data/perplexity_text.txt"))
    ap.add_argument("--out", default=str(ROOT / "data/llama_cpp_reference.json"))
    args = ap.parse_args()
    gguf = default_model_path()
    tok = Tokenizer.from_gguf()
    url = f"http://127.0.0.1:{args.port}"
    server_cmd = [args.server, "-m", str(gguf), "-t", str(args.threads), "-np", "1", "-c", "2048",
                  "--port", str(args.port), "--host", "127.0.0.1"]
    proc = subprocess.Popen(server_cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(url, proc)
        version = httpx.get(url + "/props", timeout=30).json().get("build_info", "unknown")
        chats = []
        for prompt in PROMPTS:
            text = tok.apply_chat_template([{"role": "user", "content": prompt}])
            ids = tok.encode(text)
            theirs = httpx.post(url + "/tokenize", json={"content": text, "add_special": False,
                                                          "parse_special": True}, timeout=60).json()["tokens"]
            r = httpx.post(url + "/completion", timeout=600, json={
                "prompt": ids, "n_predict": TOKENS, "temperature": 0, "top_k": 1, "cache_prompt": False,
                "return_tokens": True, "seed": 0}).json()
            chats.append({"prompt": prompt, "prompt_ids": ids, "llama_cpp_prompt_ids": theirs,
                          "tokens": r["tokens"], "text": r["content"], "stop_type": r.get("stop_type")})
            print(f"{prompt!r} -> {r['content']!r}", flush=True)
        text = pathlib.Path(args.text).read_text()
        ppl_ids = httpx.post(url + "/tokenize", json={"content": text, "add_special": True},
                             timeout=60).json()["tokens"]
    finally:
        proc.terminate()
        proc.wait(60)
    ppl_cmd = [args.perplexity, "-m", str(gguf), "-f", args.text, "-c", str(PPL_CTX), "-b", str(PPL_CTX),
               "-t", str(args.threads)]
    log = subprocess.run(ppl_cmd, capture_output=True, text=True, check=True)
    match = re.search(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)", log.stdout + log.stderr)
    if match is None:
        raise SystemExit("llama-perplexity printed no final estimate:\n" + log.stderr[-2000:])
    record = {
        "made_by": "scripts/llama_cpp_reference.py",
        "llama_cpp": version,
        "gguf": gguf.name,
        "server_command": " ".join(["llama-server", *server_cmd[1:]]).replace(str(gguf), gguf.name),
        "completion_request": {"n_predict": TOKENS, "temperature": 0, "top_k": 1, "cache_prompt": False},
        "chats": chats,
        "perplexity": {"command": " ".join(["llama-perplexity", *ppl_cmd[1:]]).replace(str(gguf), gguf.name)
                       .replace(args.text, pathlib.Path(args.text).name),
                       "text": pathlib.Path(args.text).name, "n_ctx": PPL_CTX, "token_ids": ppl_ids,
                       "ppl": float(match.group(1)), "ppl_error": float(match.group(2))},
    }
    pathlib.Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    print(f"perplexity {record['perplexity']['ppl']} +/- {record['perplexity']['ppl_error']}; wrote {args.out}")


if __name__ == "__main__":
    main()

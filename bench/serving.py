"""`flare run` under concurrent chat streams, driven by the openai async client, and optionally the
identical load against a peer OpenAI-compatible server (e.g. llama.cpp's llama-server) in the
same run.

Loads (every request streams, greedy, ignore_eos so each produces exactly --tokens tokens):
- 1, 4 and 16 concurrent clients, each sending --rounds requests back to back with short prompts;
- mixed: 4 clients with ~800-token prompts plus 12 with short ones, all at once;
- classes (flare only; bench/serving_classes.py): 12 batch-class clients with long generations keep
  every slot busy (start flare with --slots 12), then interactive clients arrive; the same load with
  service classes on and with every request in the default class, alternating.

Reported per load and server: aggregate output tok/s (tokens over the load's wall time), TTFT
p50/p99 (request sent -> first content chunk), and for the mixed load the short prompts' TTFT
p99. With --peer-url each load runs on both servers in turn, peer then flare, --repeats times
(peer, flare, peer, flare, ...), so that drifting machine load hits both alike; per load it prints
the ratios flare/peer of each pair and their range. Every request of a run is distinct (a tag of
load, repeat, client and round opens each prompt), so no server's prompt cache answers a repeat;
the i-th run on each server sends the same prompts.

Bar (issue 15): 16 streams >= 4x the aggregate tok/s of 1 stream.
Goal: >= 1.5x llama-server --parallel 16 at 16 streams; short-prompt TTFT p99 (mixed) <= 0.5x its.

--busy-start starts flare while one CPU burner per core runs (the burners stop before measuring),
so the bar can be checked for a server whose warm-up ran on a busy machine.

Run: .venv/bin/python bench/serving.py [--tokens 32] [--rounds 2] [--peer-url http://127.0.0.1:8080/v1]
     [--repeats 2] [--flare-args "--weights fp32"] [--busy-start].
docs/server.md shows how to build and start llama-server.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass

import httpx
import openai

SHORT = ["What is the capital of France?", "Name three colors.", "Write a haiku about the sea.",
         "Why is the sky blue?", "Give me a tip for learning to cook.", "What is a prime number?",
         "Describe a cat in one sentence.", "How do plants make food?"]
# ~800 tokens: a paragraph repeated, then a question about it.
PARAGRAPH = ("The printing press, developed by Johannes Gutenberg around 1440, combined movable metal type, "
             "oil-based ink and a screw press adapted from wine making. It made books cheaper, spread "
             "literacy, standardized languages and sped up the exchange of scientific ideas across Europe. ")
LONG = PARAGRAPH * 16 + "Summarize the text above in two sentences."


def distinct(prompt: str, tag: str) -> str:
    """`prompt` opened by a request tag that no other request of the run carries, so no server's
    prompt cache answers a repeat (llama-server keeps each slot's last prompt and reuses its
    longest common prefix). The tag comes first, after the chat template's fixed system part, and
    adds the same few tokens to every prompt, so lengths keep their distribution."""
    return f"(Request {tag}.) {prompt}"


@dataclass
class Result:
    ttft: list[float]
    short_ttft: list[float]
    tokens: int
    wall: float

    @property
    def tok_s(self) -> float:
        return self.tokens / self.wall


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, round(q / 100 * (len(values) - 1)))]


async def one(client: openai.AsyncOpenAI, model: str, prompt: str, tokens: int) -> tuple[float, int]:
    start = time.perf_counter()
    ttft, usage = None, None
    stream = await client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": prompt}], max_tokens=tokens, temperature=0,
        stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    async for chunk in stream:
        if ttft is None and chunk.choices and chunk.choices[0].delta.content:
            ttft = time.perf_counter() - start
        if chunk.usage is not None:
            usage = chunk.usage.completion_tokens
    return (ttft if ttft is not None else time.perf_counter() - start), usage or 0


async def run_load(url: str, model: str, prompts: list[list[str]], tokens: int) -> Result:
    """prompts[c] is client c's sequence of requests, sent back to back."""
    # No keep-alive: a server may close an idle pooled connection just as a request reuses it
    # (llama-server's HTTP library did, mid-load: "Server disconnected without sending a response").
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=0)
    client = openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0, timeout=600,
                                http_client=httpx.AsyncClient(limits=limits))
    res = Result([], [], 0, 0.0)

    async def worker(seq: list[str]) -> None:
        for p in seq:
            ttft, n = await one(client, model, p, tokens)
            res.ttft.append(ttft)
            res.tokens += n
            if not p.endswith(LONG):
                res.short_ttft.append(ttft)

    start = time.perf_counter()
    await asyncio.gather(*(worker(seq) for seq in prompts))
    res.wall = time.perf_counter() - start
    await client.close()
    return res


def loads(rounds: int, repeat: int = 0) -> dict[str, list[list[str]]]:
    """Each load's prompts for the `repeat`-th run on a server: every request of the run distinct
    (tagged with load, repeat, client and round), the same text on both servers of a pair."""
    def short(load: str, c: int) -> list[str]:
        return [distinct(SHORT[(c + r) % len(SHORT)], f"{load}.{repeat}.{c}.{r}") for r in range(rounds)]
    mixed = [[distinct(LONG, f"m.{repeat}.{c}.0")] for c in range(4)]
    mixed += [[distinct(SHORT[c % len(SHORT)], f"m.{repeat}.{c + 4}.0")] for c in range(12)]
    return {"1 stream": [short("1", 0)], "4 streams": [short("4", c) for c in range(4)],
            "16 streams": [short("16", c) for c in range(16)], "mixed 4 long + 12 short": mixed}


def start_burners() -> list[subprocess.Popen]:
    """One busy Python process per core, at normal priority: the issue's "server started while
    another process kept both cores busy"."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 1)]


def stop_burners(burners: list[subprocess.Popen]) -> None:
    for p in burners:
        p.kill()
    for p in burners:
        p.wait(60)


def start_flare(extra: list[str], port: int) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "helios.cli", "run", "--port", str(port), *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    line = proc.stdout.readline()  # the ready line (startup figures go to stderr)
    if not line.startswith("flare: serving"):
        proc.kill()
        raise SystemExit(f"flare run did not start: {line!r}")
    print(line.strip(), flush=True)
    return proc


async def model_id(url: str) -> str:
    async with httpx.AsyncClient() as c:
        return (await c.get(url.rstrip("/") + "/models", timeout=30)).json()["data"][0]["id"]


async def graph_walls(url: str) -> dict[str, tuple[float, float]] | None:
    """{shape: (executions, wall ns)} from flare's /metrics (None for a server without them)."""
    from prometheus_client.parser import text_string_to_metric_families

    async with httpx.AsyncClient() as c:
        r = await c.get(url.rstrip("/").removesuffix("/v1") + "/metrics", timeout=30)
    if r.status_code != 200:
        return None
    out: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            if s.name in ("flare_graph_executions_total", "flare_graph_wall_nanoseconds_total"):
                out.setdefault(s.labels["shape"], [0.0, 0.0])[s.name.endswith("wall_nanoseconds_total")] = s.value
    return {k: (v[0], v[1]) for k, v in out.items()}


def graph_mix(before: dict, after: dict) -> str:
    """Which graphs a load ran, with their mean wall time: shows the batch sizes the scheduler
    chose (e.g. decode at B=4 with 16 ready streams) and what each cost."""
    parts = []
    for shape in sorted(after, key=lambda k: (k.split("[")[0], int(re.sub(r"\D.*", "", k.split("=")[1])))):
        n = after[shape][0] - before.get(shape, (0, 0))[0]
        if n:
            ns = after[shape][1] - before.get(shape, (0, 0))[1]
            parts.append(f"{shape} x{n:.0f} {ns / n / 1e6:.0f} ms")
    return ", ".join(parts)


def row(name: str, r: Result, mixed: bool) -> str:
    extra = f"  short TTFT p99 {pct(r.short_ttft, 99):6.2f} s" if mixed else ""
    return (f"{name:<7} {r.tok_s:7.1f} tok/s  TTFT p50 {pct(r.ttft, 50):6.2f} s  p99 {pct(r.ttft, 99):6.2f} s"
            f"{extra}  ({r.tokens} tokens in {r.wall:.1f} s)")


def spread(values: list[float]) -> str:
    """Median and range of per-pair ratios: '0.93x (0.90-0.97x)'."""
    values = sorted(values)
    mid = values[len(values) // 2] if len(values) % 2 else (values[len(values) // 2 - 1] + values[len(values) // 2]) / 2
    return f"{mid:.2f}x" + (f" ({values[0]:.2f}-{values[-1]:.2f}x)" if len(values) > 1 else "")


def ratio_cells(flare: list[Result], peer: list[Result], mixed: bool) -> list[str]:
    """flare/peer ratios of pair i (the i-th run on each server), summarized over the pairs."""
    pairs = list(zip(flare, peer))
    cells = [f"tok/s {spread([f.tok_s / p.tok_s for f, p in pairs])}",
             f"TTFT p50 {spread([pct(f.ttft, 50) / pct(p.ttft, 50) for f, p in pairs])}",
             f"TTFT p99 {spread([pct(f.ttft, 99) / pct(p.ttft, 99) for f, p in pairs])}"]
    if mixed:
        cells.append(f"short TTFT p99 {spread([pct(f.short_ttft, 99) / pct(p.short_ttft, 99) for f, p in pairs])}"
                     " (goal <= 0.5x)")
    return cells


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=32, help="output tokens per request")
    ap.add_argument("--rounds", type=int, default=2, help="requests per client in the 1/4/16-stream loads")
    ap.add_argument("--port", type=int, default=8765)
    ap.add_argument("--flare-args", default="", help="extra `flare run` flags, e.g. '--weights int8'")
    ap.add_argument("--flare-url", help="use an already running flare server instead of starting one")
    ap.add_argument("--busy-start", action="store_true",
                    help="keep every core busy with a CPU burner while flare starts and warms up; the "
                         "burners stop before anything is measured")
    ap.add_argument("--peer-url", help="an OpenAI-compatible base URL (…/v1) to run the identical load against")
    ap.add_argument("--repeats", type=int, default=1,
                    help="with --peer-url: run each load this many times on each server, alternating "
                         "peer, flare, peer, flare, ... (ratios are printed per pair, with their range)")
    ap.add_argument("--first-repeat", type=int, default=0,
                    help="number the prompt sets from this repeat on, so a run against servers that already "
                         "served earlier runs (bench/burners.sh) sends none of their prompts again")
    ap.add_argument("--loads", default="1,4,16,mixed",
                    help="which loads to run, comma-separated from 1, 4, 16, mixed, classes (e.g. '1,16' to "
                         "repeat the bar's ratio; classes is not in the default)")
    ap.add_argument("--batch-tokens", type=int, default=256, help="classes load: output tokens per batch request")
    args = ap.parse_args()
    picked = set(args.loads.split(","))
    if not picked or not picked <= {"1", "4", "16", "mixed", "classes"}:
        ap.error(f"--loads: pick from 1, 4, 16, mixed, classes; got {args.loads!r}")
    if args.repeats < 1:
        ap.error("--repeats must be positive")
    if args.first_repeat < 0:
        ap.error("--first-repeat must be zero or more")

    proc = None
    url = args.flare_url
    if url is None:
        burners = start_burners() if args.busy_start else []
        try:
            proc = start_flare(shlex.split(args.flare_args), args.port)
        finally:
            stop_burners(burners)
        if burners:
            print(f"started under {len(burners)} CPU burners (stopped before measuring)", flush=True)
        url = f"http://127.0.0.1:{args.port}/v1"
    try:
        servers = {"flare": (url, await model_id(url))}
        if args.peer_url:
            servers["peer"] = (args.peer_url, await model_id(args.peer_url))
        print(f"load average at start: {os.getloadavg()[0]:.2f} (cores: {os.cpu_count()})", flush=True)
        results: dict[str, dict[str, list[Result]]] = {}
        chosen = [name for name in loads(args.rounds) if name.split()[0] in picked]
        order = ["peer", "flare"] * args.repeats if args.peer_url else ["flare"]
        for name in chosen:
            results[name] = {server: [] for server in servers}
            for server in order:  # alternate servers load by load
                u, model = servers[server]
                # The i-th run on each server gets the i-th prompt set: a pair shares its prompts,
                # and no run repeats one an earlier run sent (distinct).
                prompts = loads(args.rounds, args.first_repeat + len(results[name][server]))[name]
                before = await graph_walls(u) if server == "flare" else None
                results[name][server].append(await run_load(u, model, prompts, args.tokens))
                print(f"[{name}] {row(server, results[name][server][-1], name.startswith('mixed'))}", flush=True)
                if before is not None:
                    print(f"    graphs: {graph_mix(before, await graph_walls(u) or {})}", flush=True)
        if "classes" in picked:  # flare only: --repeats pairs of (default, classes) runs
            from serving_classes import ClassLoad, class_rows

            load = ClassLoad(batch_tokens=args.batch_tokens, rounds=args.rounds, tokens=args.tokens)
            for line in await class_rows(url, servers["flare"][1], load, args.repeats, pct, spread):
                print(line, flush=True)
        print(f"load average at end: {os.getloadavg()[0]:.2f}\n")
        for server in servers if {"1 stream", "16 streams"} <= set(results) else ():
            one_s, sixteen = results["1 stream"][server][0], results["16 streams"][server][0]
            print(f"{server}: 16 streams / 1 stream aggregate tok/s = {sixteen.tok_s / one_s.tok_s:.2f}x (bar: >= 4x)")
        if args.peer_url:
            for name, by in results.items():
                cells = ratio_cells(by["flare"], by["peer"], name.startswith("mixed"))
                print(f"flare/peer [{name}]: " + ", ".join(cells))
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(60)


if __name__ == "__main__":
    asyncio.run(main())

"""The class row of bench/serving.py (`--loads classes`, issue 40): batch clients keep every slot busy
with long generations, then interactive clients arrive.

Each run has two phases on one server:
1. --batch-clients clients (12) each stream long generations (--batch-tokens) back to back, until the
   run ends; the interactive phase starts once every one of them has its first token (every slot busy
   when the server has as many slots: start flare with `--slots 12`).
2. --interactive-clients clients arrive --stagger seconds apart, each sending --rounds short requests
   of --tokens tokens back to back.
The window is the interactive phase: from its start to the last interactive response. Reported per
run: the interactive TTFT p50/p99 and the p99 of every gap between consecutive content chunks of the
interactive streams, and the batch clients' tok/s inside the window (content chunks: one token each
without speculation). Then the batch streams are cancelled (the client closes them) and the bench
waits for every slot to be free again.

Two modes, the same load: `classes` (batch requests send service_tier "batch", interactive ones
"interactive": the server's class table, built in or --service-classes, prices them) and `default`
(no service_tier: every request in the table's default class). They alternate, default first,
--repeats times. Every request's prompt carries a tag no other request has, so no checkpoint of an
earlier run answers it.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families

MODES = ("default", "classes")
TIERS = {"classes": ("batch", "interactive"), "default": (None, None)}  # (batch, interactive) service_tier
BATCH_PROMPTS = ["Write a long story about a lighthouse keeper.", "Explain in detail how a steam engine works.",
                 "Describe the history of the printing press at length.", "Write a long letter to a friend."]
INTERACTIVE_PROMPTS = ["What is the capital of France?", "Name three colors.", "Why is the sky blue?",
                       "Write a haiku about the sea.", "What is a prime number?", "How do plants make food?"]


@dataclass
class ClassLoad:
    """The shape of the load (bench/serving.py's flags)."""

    batch_clients: int = 12
    batch_tokens: int = 256
    interactive_clients: int = 4
    rounds: int = 2
    tokens: int = 32
    stagger_s: float = 0.5


@dataclass
class ClassRun:
    """One run's figures: interactive TTFTs and gaps (s), batch content chunks inside the window."""

    mode: str
    ttft: list[float] = field(default_factory=list)
    gaps: list[float] = field(default_factory=list)
    batch_tokens: int = 0
    window: float = 0.0
    batch_requests: int = 0

    @property
    def batch_tok_s(self) -> float:
        return self.batch_tokens / self.window if self.window > 0 else float("nan")


async def stream(client: openai.AsyncOpenAI, model: str, prompt: str, tokens: int, tier: str | None,
                 on_chunk) -> float | None:
    """One streamed request; `on_chunk(t)` at each content chunk's arrival (perf_counter). Returns the
    TTFT, or None when no content arrived."""
    start = time.perf_counter()
    body = {"ignore_eos": True, **({"service_tier": tier} if tier is not None else {})}
    first = None
    response = await client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": prompt}], max_tokens=tokens, temperature=0,
        stream=True, extra_body=body)
    async with response:
        async for chunk in response:
            if chunk.choices and chunk.choices[0].delta.content:
                now = time.perf_counter()
                first = now - start if first is None else first
                on_chunk(now)
    return first


def interactive_gaps(times: list[float]) -> list[float]:
    """The gaps between consecutive content chunks of one stream."""
    return [b - a for a, b in zip(times, times[1:])]


async def slots(url: str) -> tuple[int, int] | None:
    """(free, total) request slots from flare's /metrics, or None without them."""
    async with httpx.AsyncClient() as c:
        r = await c.get(url.rstrip("/").removesuffix("/v1") + "/metrics", timeout=30)
    if r.status_code != 200:
        return None
    values = {s.name: s.value for fam in text_string_to_metric_families(r.text) for s in fam.samples
              if s.name in ("flare_request_slots_free", "flare_request_slots")}
    if len(values) < 2:
        return None
    return int(values["flare_request_slots_free"]), int(values["flare_request_slots"])


async def wait_idle(url: str, limit_s: float = 120.0) -> None:
    """Until every slot is free again (the cancelled batch streams retired), at most `limit_s`."""
    deadline = time.perf_counter() + limit_s
    while time.perf_counter() < deadline:
        s = await slots(url)
        if s is None or s[0] == s[1]:
            return
        await asyncio.sleep(0.2)
    raise SystemExit(f"the server still held slots {limit_s:.0f} s after the run's streams were closed")


async def run_classes(url: str, model: str, load: ClassLoad, mode: str, tag: str) -> ClassRun:
    """One run of the class load in `mode` ("classes" or "default"); `tag` makes its prompts unique."""
    batch_tier, interactive_tier = TIERS[mode]
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=0)
    client = openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0, timeout=600,
                                http_client=httpx.AsyncClient(limits=limits))
    run = ClassRun(mode)
    window = [float("inf"), float("inf")]  # start, end (perf_counter)
    started = [asyncio.Event() for _ in range(load.batch_clients)]

    def count(t: float) -> None:
        if window[0] <= t <= window[1]:
            run.batch_tokens += 1

    async def batch(c: int) -> None:
        r = 0
        while True:  # cancelled when the interactive phase ends
            prompt = f"(Request {tag}.b{c}.{r}.) {BATCH_PROMPTS[c % len(BATCH_PROMPTS)]}"
            r += 1
            run.batch_requests += 1
            await stream(client, model, prompt, load.batch_tokens, batch_tier,
                         lambda t: (started[c].set(), count(t)))

    async def interactive(c: int) -> None:
        await asyncio.sleep(c * load.stagger_s)
        for r in range(load.rounds):
            prompt = f"(Request {tag}.i{c}.{r}.) {INTERACTIVE_PROMPTS[(c + r) % len(INTERACTIVE_PROMPTS)]}"
            times: list[float] = []
            ttft = await stream(client, model, prompt, load.tokens, interactive_tier, times.append)
            if ttft is not None:
                run.ttft.append(ttft)
            run.gaps += interactive_gaps(times)

    batch_tasks = [asyncio.create_task(batch(c)) for c in range(load.batch_clients)]
    try:
        # Every batch stream's first token, unless a batch request fails first (its error is raised).
        busy = asyncio.ensure_future(asyncio.gather(*(e.wait() for e in started)))
        done, _ = await asyncio.wait([busy, *batch_tasks], timeout=600, return_when=asyncio.FIRST_COMPLETED)
        if busy not in done:
            busy.cancel()
            failed = next((t for t in done if t.exception() is not None), None)
            raise SystemExit(f"the batch clients did not all start streaming: "
                             f"{failed.exception() if failed else 'no first token within 600 s'}")
        window[0] = time.perf_counter()
        await asyncio.gather(*(interactive(c) for c in range(load.interactive_clients)))
        window[1] = time.perf_counter()
        run.window = window[1] - window[0]
    finally:
        for task in batch_tasks:
            task.cancel()
        await asyncio.gather(*batch_tasks, return_exceptions=True)
        await client.close()
    await wait_idle(url)
    return run


def row(r: ClassRun, pct) -> str:
    return (f"[classes] {r.mode:<8} interactive TTFT p50 {pct(r.ttft, 50):6.2f} s  p99 {pct(r.ttft, 99):6.2f} s  "
            f"gap p99 {pct(r.gaps, 99):6.3f} s ({len(r.ttft)} requests)  batch {r.batch_tok_s:6.1f} tok/s "
            f"({r.batch_tokens} tokens in {r.window:.1f} s, {r.batch_requests} batch requests)")


def report(runs: dict[str, list[ClassRun]], pct, spread, slot_count: int | None) -> list[str]:
    """Lines for bench/serving.py: each run, then the classes/default ratios of each pair (median and
    range, `spread`), with `pct(values, q)` the bench's percentile."""
    lines = [row(r, pct) for mode in MODES for r in runs[mode]]
    pairs = list(zip(runs["classes"], runs["default"]))
    cells = [f"interactive TTFT p50 {spread([pct(c.ttft, 50) / pct(d.ttft, 50) for c, d in pairs])}",
             f"TTFT p99 {spread([pct(c.ttft, 99) / pct(d.ttft, 99) for c, d in pairs])}",
             f"gap p99 {spread([pct(c.gaps, 99) / pct(d.gaps, 99) for c, d in pairs])}",
             f"batch tok/s {spread([c.batch_tok_s / d.batch_tok_s for c, d in pairs])}"]
    lines.append("classes/default: " + ", ".join(cells))
    if slot_count is not None:
        lines.append(f"(server slots: {slot_count}; the batch clients keep every slot busy only when they "
                     f"are at least as many)")
    return lines


async def class_rows(url: str, model: str, load: ClassLoad, repeats: int, pct, spread) -> list[str]:
    """Both modes, alternating default, classes, default, ... `repeats` times; the report's lines."""
    await wait_idle(url)
    s = await slots(url)
    runs: dict[str, list[ClassRun]] = {mode: [] for mode in MODES}
    for i in range(repeats):
        for mode in MODES:
            r = await run_classes(url, model, load, mode, f"c{i}{mode[0]}")
            runs[mode].append(r)
            print(row(r, pct), flush=True)
    return report(runs, pct, spread, None if s is None else s[1])

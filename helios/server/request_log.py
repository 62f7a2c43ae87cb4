"""What a running server says at `--log-level info`: one line per finished request, and a status
line every few seconds while it is busy (vLLM's "Avg prompt throughput ... Running: N reqs" line).

Both go to the `flare` logger. The request line is formatted on the runtime thread when a stream
ends, and only when the logger is enabled for INFO; the status line comes from its own thread,
from one `Runtime.snapshot()` per interval.
"""

from __future__ import annotations

import logging
import sys
import threading
import time

log = logging.getLogger("flare")

STATUS_EVERY_S = 5.0


def configure(level: str) -> None:
    """The `flare` logger at `level` (a --log-level name), to stderr with the time of day."""
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s flare: %(message)s", "%H:%M:%S"))
        log.addHandler(handler)
        log.propagate = False
    log.setLevel(level.upper())


def request_line(stream) -> str:
    """`request ID [class C]: prompt P tok, output N tok, TTFT T ms, R tok/s, E s, finish F`.
    tok/s is the decode rate after the first token: (N - 1) over first-to-last output."""
    m, usage = stream.metrics, stream.usage
    cls = getattr(stream.params, "service_class", None)
    cls = getattr(cls, "name", cls)
    ttft = f"{m.ttft_ns / 1e6:.0f} ms" if m.ttft_ns is not None else "-"
    rate = "-"
    if m.first_output_ns is not None and m.last_output_ns is not None and m.last_output_ns > m.first_output_ns:
        rate = f"{(usage.completion_tokens - 1) / ((m.last_output_ns - m.first_output_ns) / 1e9):.1f}"
    total = f"{(m.finished_ns - m.submitted_ns) / 1e9:.2f} s" if m.finished_ns is not None else "-"
    reason = stream.finish_reason + (f" ({stream.error})" if stream.error else "")
    return (f"request {stream.request_id or stream.handle}{f' class {cls}' if cls else ''}: prompt "
            f"{usage.prompt_tokens} tok, output {usage.completion_tokens} tok, TTFT {ttft}, {rate} tok/s, "
            f"{total}, finish {reason}")


def log_request(stream) -> None:
    if log.isEnabledFor(logging.INFO):
        log.info(request_line(stream))


def chain(*hooks):
    """One on_finish hook that runs each of `hooks` (None entries skipped) in order."""
    hooks = [h for h in hooks if h is not None]

    def run(stream) -> None:
        for hook in hooks:
            hook(stream)
    return run


def status_line(snap, stats, prompt_rate: float, generation_rate: float) -> str:
    return (f"status: prompt {prompt_rate:.1f} tok/s, generation {generation_rate:.1f} tok/s; running "
            f"{snap.running}, waiting {snap.waiting}; slots free {snap.free_slots}/{snap.total_slots}; "
            f"KV pages free {snap.free_pages}/{snap.total_pages}")


class StatusReporter:
    """Logs `status_line` every `every_s` seconds while requests run or wait, or tokens moved."""

    def __init__(self, runtime, every_s: float = STATUS_EVERY_S):
        self.runtime = runtime
        self.every_s = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="flare-status", daemon=True)

    def start(self) -> StatusReporter:
        if self.every_s > 0 and log.isEnabledFor(logging.INFO):
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        _, stats = self.runtime.snapshot()
        last = (time.monotonic(), stats.prompt_tokens, stats.generated_tokens)
        while not self._stop.wait(self.every_s):
            snap, stats = self.runtime.snapshot()
            now = time.monotonic()
            dt = max(now - last[0], 1e-9)
            prompt, generated = stats.prompt_tokens - last[1], stats.generated_tokens - last[2]
            last = (now, stats.prompt_tokens, stats.generated_tokens)
            if snap.running or snap.waiting or prompt or generated:
                log.info(status_line(snap, stats, prompt / dt, generated / dt))

"""Issue 43: a server people can watch and stop. Startup lines as they happen, a line per finished
request and a status line at --log-level info, token counters that move while a request runs,
a drain line on the first signal and a quiet exit on the second."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import types

import httpx

from helios.graphs import Catalog, GraphKind, GraphShape
from helios.runtime.stream import RequestMetrics, Usage
from helios.server.request_log import request_line
from helios.server.startup import WIDTH
from helios.server.warmup import WarmupConfig, measure

from .support import free_port, metrics, value, wait_for


class _Flare:
    """`flare run ARGS` with stderr read line by line as it comes (the test sees each line when
    the server prints it)."""

    def __init__(self, *args: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.lines: list[str] = []
        self.cond = threading.Condition()
        self.proc = subprocess.Popen([sys.executable, "-m", "helios.cli", "run", "--port", str(self.port), *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"})
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stderr:
            with self.cond:
                self.lines.append(line.rstrip("\n"))
                self.cond.notify_all()
        with self.cond:
            self.lines.append(None)  # EOF
            self.cond.notify_all()

    def wait_line(self, needle: str, timeout: float = 240.0) -> str:
        with self.cond:
            found = self.cond.wait_for(lambda: any(l is None or needle in l for l in self.lines), timeout)
            hit = next((l for l in self.lines if l is not None and needle in l), None)
            assert found and hit is not None, f"no line with {needle!r} in:\n" + "\n".join(map(str, self.lines))
            return hit

    def text(self) -> str:
        with self.cond:
            return "\n".join(l for l in self.lines if l is not None)

    def ready(self, timeout: float = 240.0) -> None:
        assert self.proc.stdout.readline().startswith("flare: serving"), self.text()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def _refused(url: str) -> bool:
    try:
        httpx.get(url + "/health", timeout=2)
    except httpx.ConnectError:
        return True
    return False


def test_startup_lines_come_as_they_happen_and_requests_are_logged_at_info():
    """Rule: each startup stage prints when it begins (sizing, loading, the warm-up as k/N graphs
    with elapsed time, plain lines without a terminal), while the server is not yet up; at
    --log-level info a finished request gets one line with its tokens, TTFT, rate and finish."""
    flare = _Flare("--slots", "2", "--max-context", "512", "--prefill-capacity", "64", "--log-level", "info")
    try:
        sizing = flare.wait_line("request slots (set)")
        assert "KV cache" in sizing
        flare.wait_line("loading SmolLM2-135M-Instruct")
        progress = flare.wait_line("warm-up first runs: ")
        assert _refused(flare.url)  # printed during startup, not once serving began
        assert " graphs, " in progress and progress.rstrip().endswith(" s")
        summary = flare.wait_line("graphs timed")
        assert flare.text().index(progress) < flare.text().index(summary)
        flare.ready()
        table = [l for l in flare.text()[flare.text().index(summary):].splitlines()[1:] if l.startswith("flare:   ")]
        assert table and all(len(line) <= WIDTH + len("flare: ") for line in table)
        r = httpx.post(flare.url + "/v1/completions", json={"prompt": "Hello", "max_tokens": 5}, timeout=120)
        assert r.status_code == 200
        line = flare.wait_line(f"request {r.json()['id']}")
        assert "prompt 1 tok, output 5 tok, TTFT " in line and line.endswith("finish length"), line
    finally:
        assert flare.stop() == 0


def test_token_counters_move_while_a_request_runs_and_the_status_line_reports_it():
    """Rule: flare_generation_tokens_total counts tokens as they are published, not at the end;
    the status line names throughput, running, waiting and slots while a request runs."""
    flare = _Flare("--engine", "sim", "--sim-pace", "4", "--log-level", "info", "--log-status-every", "0.2")
    try:
        flare.ready()
        with httpx.stream("POST", flare.url + "/v1/completions", timeout=60,
                          json={"prompt": "abc", "max_tokens": 400, "stream": True}) as r:
            # Holding the line iterator keeps the stream open: a dropped one is closed, and with it
            # the connection (the server would see a disconnect and cancel the request).
            lines, seen = r.iter_lines(), 0
            for line in lines:
                if line.startswith("data: {"):
                    seen += len(json.loads(line[6:])["choices"][0]["text"])
                if seen >= 20:
                    break
            mid = value(metrics(flare.url), "flare_generation_tokens_total")
            assert 20 <= mid < 400  # counted while the request still runs
            status = flare.wait_line("running 1, waiting 0")
            assert "generation " in status and "slots free 3/4" in status
    finally:
        assert flare.stop() == 0


def test_first_signal_says_what_drains_and_a_second_exits_quietly():
    """Rule: SIGINT prints what is being drained and for how long; a second SIGINT exits at once
    without tracebacks."""
    flare = _Flare("--engine", "sim", "--sim-pace", "20", "--shutdown-grace", "60")
    try:
        flare.ready()
        with httpx.stream("POST", flare.url + "/v1/completions", timeout=60,
                          json={"prompt": "abc", "max_tokens": 1000, "stream": True}) as r:
            lines = r.iter_lines()  # held: dropping it would close the connection (see above)
            next(line for line in lines if line.startswith("data: {"))
            flare.proc.send_signal(signal.SIGINT)
            drain = flare.wait_line("draining")
            assert "draining 1 request for up to 60 s" in drain
            flare.proc.send_signal(signal.SIGINT)
            assert flare.proc.wait(30) == 1
    finally:
        if flare.proc.poll() is None:  # a failed check must not leave the server running
            flare.proc.kill()
            flare.proc.wait()
    flare.wait_line("exiting now")
    assert "Traceback" not in flare.text() and "CancelledError" not in flare.text(), flare.text()


class _Core:
    def __init__(self, shapes):
        self.catalog = Catalog(shapes)
        self.runs = []

    def time_graph(self, shape, context):
        self.runs.append(shape)
        return 1_000_000


def test_warmup_reports_each_pass_as_k_of_n_graphs_and_wraps_its_table():
    shapes = [GraphShape(GraphKind.DECODE, b) for b in (1, 2, 4, 8, 16, 32, 64)] + \
             [GraphShape(GraphKind.PREFILL, b, c) for b in (1, 2, 4) for c in (64, 256, 1024)]
    core, calls = _Core(shapes), []
    report = measure(core, WarmupConfig(discard=1, rounds=2),
                     progress=lambda stage, k, n: calls.append((stage, k, n)))
    n = len(shapes)
    assert calls == [(stage, k, n) for stage in ("first runs", "round 1/2", "round 2/2") for k in range(1, n + 1)]
    lines = report.describe_lines()
    assert lines[0].endswith(f"{n} graphs timed (median ms per run)")
    assert all(len(line) <= WIDTH for line in lines)
    assert any(line.startswith("  decode: B=1 1 ms") for line in lines)


def test_request_line_names_id_class_tokens_ttft_rate_and_finish():
    m = RequestMetrics(submitted_ns=0, first_output_ns=200_000_000, last_output_ns=1_200_000_000,
                       finished_ns=1_300_000_000)
    stream = types.SimpleNamespace(metrics=m, usage=Usage(12, 21), request_id="cmpl-7", handle=3,
                                   finish_reason="stop", error=None,
                                   params=types.SimpleNamespace(service_class=types.SimpleNamespace(name="batch")))
    assert request_line(stream) == ("request cmpl-7 class batch: prompt 12 tok, output 21 tok, TTFT 200 ms, "
                                    "20.0 tok/s, 1.30 s, finish stop")


def test_warmup_progress_is_a_bar_on_a_terminal_and_plain_lines_otherwise():
    import io

    from helios.server.startup import StartupLog

    plain = io.StringIO()
    progress = StartupLog(plain, tty=False).warmup()
    for k in range(1, 4):
        progress("first runs", k, 3)
    progress.close()
    assert plain.getvalue().splitlines()[-1].startswith("flare: warm-up first runs: 3/3 graphs, ")
    bar = io.StringIO()
    progress = StartupLog(bar, tty=True).warmup()
    progress("round 1/3", 2, 5)
    progress.close()
    assert "flare: warm-up round 1/3: 2/5 graphs" in bar.getvalue() and "\r" in bar.getvalue()

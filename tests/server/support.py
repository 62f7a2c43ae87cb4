"""Helpers for the server tests: `flare run` subprocesses, metrics parsing, SSE parsing."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import httpx
from prometheus_client.parser import text_string_to_metric_families


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FlareServer:
    """`flare run ARGS` on a free loopback port; waits for its ready line and /health."""

    def __init__(self, *args: str, start_timeout: float = 180.0, port: int | None = None):
        self.port = free_port() if port is None else port
        self.url = f"http://127.0.0.1:{self.port}"
        self.stderr = tempfile.TemporaryFile(mode="w+")
        cmd = [sys.executable, "-m", "helios.cli", "run", "--port", str(self.port), *args]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.stderr, text=True,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.ready_line = self._wait_ready(start_timeout)

    def _wait_ready(self, timeout: float) -> str | None:
        box: list[str] = []
        reader = threading.Thread(target=lambda: box.append(self.proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(timeout)
        line = box[0].strip() if box else None
        if not line:
            return None  # exited (see exit_code/error_text) or timed out
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    return line
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        return None

    @property
    def exit_code(self) -> int | None:
        return self.proc.poll()

    def error_text(self) -> str:
        self.stderr.seek(0)
        return self.stderr.read()

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM, then wait; returns the exit status (kills it on timeout)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


class InProcessServer:
    """The app served by uvicorn on a thread of this process, on a free loopback port: real
    HTTP and SSE for the openai client, with the backend (and a wrapped core) inspectable."""

    def __init__(self, app, start_timeout: float = 60.0, settings=None):
        import uvicorn

        self.app = app
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        if settings is not None:  # flare run's own uvicorn settings (connection limits and timeouts)
            from helios.server.serve import uvicorn_config

            config = uvicorn_config(app, settings, "127.0.0.1", self.port)
        else:
            config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on",
                                    timeout_graceful_shutdown=5)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="test-uvicorn", daemon=True)
        self.thread.start()
        wait_for(lambda: self.server.started or not self.thread.is_alive(), start_timeout, "uvicorn to start")
        assert self.server.started, "the in-process server did not start"

    def stop(self, timeout: float = 60.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the in-process server did not stop"


def metrics(url: str) -> dict[tuple, float]:
    """{(sample name, ((label, value), ...)): value} from /metrics."""
    text = httpx.get(url + "/metrics", timeout=10).text
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(snapshot: dict, name: str, **labels) -> float:
    return snapshot.get((name, tuple(sorted(labels.items()))), 0.0)


def graph_counts(snapshot: dict) -> dict[str, float]:
    return {dict(labels)["shape"]: v for (name, labels), v in snapshot.items() if name == "flare_graph_executions_total"}


def graph_delta(before: dict, after: dict) -> dict[str, int]:
    a, b = graph_counts(before), graph_counts(after)
    return {k: int(b[k] - a.get(k, 0)) for k in sorted(b) if b[k] - a.get(k, 0)}


def wait_for(predicate, timeout: float, what: str, poll_s: float = 0.01):
    """Poll `predicate` until it returns something truthy (returned); fail with `what` after
    `timeout` seconds instead of hanging. Deadlines are generous: they bound a hang, never
    measure speed."""
    deadline = time.monotonic() + timeout
    while not (result := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(poll_s)
    return result


def is_idle(snap: dict) -> bool:
    """No live request, and every slot and page free, in one /metrics scrape."""
    return (value(snap, "flare_requests_running") == 0 and value(snap, "flare_requests_waiting") == 0
            and value(snap, "flare_request_slots_free") == value(snap, "flare_request_slots")
            and value(snap, "flare_kv_pages_free") == value(snap, "flare_kv_pages"))


def wait_resources_free(url: str, timeout: float = 60.0) -> dict:
    """Poll /metrics until no request is live and every slot and page is free; returns that
    scrape, or fails with the last one after `timeout` seconds."""
    last: dict = {}

    def idle():
        last["snap"] = metrics(url)
        return is_idle(last["snap"])

    try:
        wait_for(idle, timeout, "every slot and page to be free", poll_s=0.1)
    except AssertionError as exc:
        gauges = {k[0]: v for k, v in last["snap"].items() if k[0].startswith(("flare_request", "flare_kv"))}
        raise AssertionError(f"{exc}; last scrape {gauges}") from None
    return last["snap"]


def sse_events(body: str) -> list:
    """The data payloads of an SSE body: parsed JSON objects, and "[DONE]" as a string."""
    events = []
    for block in body.split("\n\n"):
        if not block.strip():
            continue
        assert block.startswith("data: "), f"not an SSE data event: {block!r}"
        data = block[len("data: "):]
        events.append(data if data == "[DONE]" else json.loads(data))
    return events


async def raw_request(port: int, body: dict, endpoint: str, leave_after: float | None) -> object:
    """POST `body` on a raw loopback socket and read the whole response, or close the socket
    (a client disconnect) after `leave_after` seconds. Returns the HTTP status (int), or where
    the client left: "left waiting" (no byte yet: queued, prefilling, or a non-streaming request
    still running), "left headers" (a stream's headers, no token yet) or "left streaming" (after
    at least one data event). A raw socket per client is cheap on a 2-core machine, and closing
    it is exactly a disconnect."""
    import asyncio

    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    payload = json.dumps(body).encode()
    writer.write(f"POST {endpoint} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
                 f"content-length: {len(payload)}\r\nconnection: close\r\n\r\n".encode() + payload)
    received = bytearray()

    async def pump():
        while chunk := await reader.read(65536):
            received.extend(chunk)

    try:
        await asyncio.wait_for(pump(), leave_after if leave_after is not None else 600)
        return int(received.split(b" ", 2)[1]) if received else "empty"
    except asyncio.TimeoutError:
        return "left " + ("streaming" if b"data: {" in received else "headers" if received else "waiting")
    finally:
        writer.close()

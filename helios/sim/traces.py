"""Workloads for the simulator: real arrival traces, ShareGPT lengths with gamma arrivals, a fairness mix.

Every loader returns `TraceRequest`s sorted by arrival, with arrival times in integer nanoseconds from the
start of the workload. Lengths are clipped so that prompt + output fits `max_context` (the simulated model's
window; raise it for Mooncake, whose prompts run to 128k) and both are at least 1. The files themselves are
described in data/PROVENANCE.md.
"""

from __future__ import annotations

import csv
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from helios.errors import ConfigError

NS_PER_S = 1_000_000_000
DEFAULT_MAX_CONTEXT = 8192
MOONCAKE_BLOCK_TOKENS = 512  # the Mooncake trace hashes prompts in 512-token blocks

AZURE_CONV = "azure2023_conv.csv"
MOONCAKE_CONV = "mooncake_conversation_trace.jsonl"
SHAREGPT_LENGTHS = "sharegpt_val_10k_llama2_lengths.csv"


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a workload: when it arrives and how long it is."""

    arrival_ns: int
    prompt_tokens: int
    output_tokens: int
    client: str = "default"
    prefix_blocks: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class ClientSpec:
    """One client of `multi_client`: its arrival rate and how its ShareGPT lengths are scaled."""

    name: str
    rate_per_s: float
    prompt_scale: float = 1.0
    output_scale: float = 1.0
    burstiness: float = 1.0


def default_data_dir(root: Path | None = None) -> Path:
    """The project's data/ folder (helios/../data); every loader also takes an explicit path."""
    path = (root or Path(__file__).resolve().parents[2]) / "data"
    if not path.is_dir():
        raise FileNotFoundError(
            f"simulator data folder not found at {path}; copy the files listed in data/PROVENANCE.md there "
            "(from the project's shared data set) or pass the file's path to the loader")
    return path


def data_file(name: str, path: str | os.PathLike[str] | None = None) -> Path:
    """`path` if given, else `name` inside the data folder; a clear error when the file is absent."""
    resolved = Path(path) if path is not None else default_data_dir() / name
    if not resolved.is_file():
        raise FileNotFoundError(f"data file not found: {resolved}")
    return resolved


def clip_lengths(prompt: int, output: int, max_context: int = DEFAULT_MAX_CONTEXT) -> tuple[int, int]:
    """Clip so that 1 <= prompt, 1 <= output and prompt + output <= max_context.

    The prompt is truncated first: half the Mooncake prompts exceed 8k tokens, and cutting their outputs
    to one token instead would erase the decode work the trace describes.
    """
    if max_context < 2:
        raise ConfigError("max_context", f"must be at least 2, got {max_context}")
    o = min(max(int(output), 1), max_context - 1)
    return min(max(int(prompt), 1), max_context - o), o


def _window(times_s: np.ndarray, start_s: float, duration_s: float | None, rate_scale: float,
            limit: int | None) -> np.ndarray:
    """Indices of rows in [start_s, start_s + duration_s) of trace time, capped at `limit`."""
    if rate_scale <= 0:
        raise ConfigError("rate_scale", f"must be positive, got {rate_scale}")
    if start_s < 0 or (duration_s is not None and duration_s < 0):
        raise ConfigError("start_s", "the window must have a nonnegative start and duration")
    keep = times_s >= start_s
    if duration_s is not None:
        keep &= times_s < start_s + duration_s
    idx = np.flatnonzero(keep)
    return idx if limit is None else idx[: max(int(limit), 0)]


def _arrival_ns(t_s: float, start_s: float, rate_scale: float) -> int:
    # The window is cut in trace time, then rebased to its start and compressed by rate_scale.
    return int(round((t_s - start_s) / rate_scale * NS_PER_S))


def load_azure_conv(path: str | os.PathLike[str] | None = None, *, start_s: float = 0.0,
                    duration_s: float | None = None, rate_scale: float = 1.0, limit: int | None = None,
                    max_context: int = DEFAULT_MAX_CONTEXT) -> list[TraceRequest]:
    """Azure LLM inference trace 2023, conversation service (TIMESTAMP, ContextTokens, GeneratedTokens).

    Trace time is measured from the first row; rows in [start_s, start_s + duration_s) are kept and arrive
    at (t - start_s) / rate_scale, so rate_scale = 2 doubles the request rate.
    """
    file = data_file(AZURE_CONV, path)
    rows = _azure_rows(file)
    times_s = rows[:, 0] - rows[0, 0] if len(rows) else np.zeros(0)
    out = []
    for i in _window(times_s, start_s, duration_s, rate_scale, limit):
        p, o = clip_lengths(int(rows[i, 1]), int(rows[i, 2]), max_context)
        out.append(TraceRequest(_arrival_ns(times_s[i], start_s, rate_scale), p, o))
    return _sorted(out)


AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
MOONCAKE_FIELDS = ("timestamp", "input_length", "output_length")


def _azure_rows(file: Path) -> np.ndarray:
    """(seconds since the epoch, prompt, output) per row; a ConfigError names a missing column or the
    first malformed line."""
    with open(file, newline="") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in AZURE_COLUMNS if c not in (reader.fieldnames or ())]
        if missing:
            raise ConfigError("trace", f"{file}: not an Azure trace CSV: missing column(s) {', '.join(missing)} "
                              f"(found {', '.join(reader.fieldnames or ()) or 'no header'})")
        out = []
        for r in reader:
            try:
                t = np.datetime64(r["TIMESTAMP"].strip().replace(" ", "T"), "ns").astype(np.int64) / NS_PER_S
                out.append((t, int(r["ContextTokens"]), int(r["GeneratedTokens"])))
            except (ValueError, TypeError, AttributeError) as exc:
                raise ConfigError("trace", f"{file}, line {reader.line_num}: malformed row {r!r} ({exc})") from None
            _positive(file, reader.line_num, ContextTokens=out[-1][1], GeneratedTokens=out[-1][2])
    return np.array(out, dtype=np.float64).reshape(-1, 3)


def _positive(file: Path, line: int, **counts) -> None:
    # A token count of zero or less is a broken row, not a length to clip to 1 without a word.
    for name, count in counts.items():
        if not count > 0:
            raise ConfigError("trace", f"{file}, line {line}: {name} must be a positive token count, got {count}")


def _mooncake_rows(file: Path) -> list[dict]:
    """The JSON objects of a Mooncake trace; a ConfigError names the first malformed line or field."""
    rows = []
    with open(file) as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ConfigError("trace", f"{file}, line {number}: not JSON ({exc.msg})") from None
            missing = [k for k in MOONCAKE_FIELDS if not isinstance(r, dict) or k not in r]
            if missing:
                raise ConfigError("trace", f"{file}, line {number}: missing field(s) {', '.join(missing)}")
            if not all(isinstance(r[k], (int, float)) and not isinstance(r[k], bool) for k in MOONCAKE_FIELDS):
                raise ConfigError("trace", f"{file}, line {number}: {', '.join(MOONCAKE_FIELDS)} must be numbers")
            _positive(file, number, input_length=r["input_length"], output_length=r["output_length"])
            rows.append(r)
    return rows


def trace_format(path: str | os.PathLike[str]) -> str:
    """"azure" or "mooncake", from the file's first non-empty line: a JSON object means the Mooncake
    JSONL format, anything else the Azure CSV (whose header is then checked when it is read)."""
    with open(path) as fh:
        first = next((line for line in fh if line.strip()), "")
    return "mooncake" if first.lstrip().startswith("{") else "azure"


def load_trace_file(path: str | os.PathLike[str], fmt: str | None = None, **window) -> list[TraceRequest]:
    """A user's trace in the Azure CSV or the Mooncake JSONL format (`fmt`, else detected)."""
    if not Path(path).is_file():
        raise ConfigError("trace", f"trace file not found: {path}")
    fmt = fmt or trace_format(path)
    if fmt == "azure":
        return load_azure_conv(path, **window)
    if fmt == "mooncake":
        return load_mooncake(path, **window)
    raise ConfigError("trace", f"unknown trace format {fmt!r}; choose azure or mooncake")


def load_mooncake(path: str | os.PathLike[str] | None = None, *, start_s: float = 0.0,
                  duration_s: float | None = None, rate_scale: float = 1.0, limit: int | None = None,
                  max_context: int = DEFAULT_MAX_CONTEXT) -> list[TraceRequest]:
    """Mooncake conversation trace (timestamp in ms, input_length, output_length, hash_ids).

    hash_ids become `prefix_blocks` (one id per 512-token prompt block; equal ids mean a shared prefix),
    truncated to the blocks the clipped prompt still covers. Window options as in `load_azure_conv`.
    """
    rows = _mooncake_rows(data_file(MOONCAKE_CONV, path))
    stamps = np.array([int(r["timestamp"]) for r in rows], dtype=np.int64)
    times_s = (stamps - stamps[0]) / 1000.0 if len(rows) else np.zeros(0)
    out = []
    for i in _window(times_s, start_s, duration_s, rate_scale, limit):
        r = rows[i]
        p, o = clip_lengths(int(r["input_length"]), int(r["output_length"]), max_context)
        blocks = tuple(int(h) for h in r.get("hash_ids", ()))[: math.ceil(p / MOONCAKE_BLOCK_TOKENS)]
        out.append(TraceRequest(_arrival_ns(times_s[i], start_s, rate_scale), p, o, prefix_blocks=blocks))
    return _sorted(out)


def load_sharegpt_lengths(path: str | os.PathLike[str] | None = None) -> np.ndarray:
    """ShareGPT (Llama-2 tokenizer) lengths as an (n, 2) int array of (prompt, output) tokens."""
    with open(data_file(SHAREGPT_LENGTHS, path), newline="") as fh:
        rows = [(int(r["num_prefill_tokens"]), int(r["num_decode_tokens"])) for r in csv.DictReader(fh)]
    return np.array(rows, dtype=np.int64)


def gamma_arrivals_ns(rate_per_s: float, n: int, rng: np.random.Generator,
                      burstiness: float = 1.0) -> np.ndarray:
    """n arrival times of a renewal process with gamma gaps: mean 1/rate, CV^2 = burstiness.

    Shape k = 1/burstiness and scale = burstiness/rate; burstiness 1 is Poisson (exponential gaps),
    larger values are burstier. The first request arrives after one gap, as in a process started at 0.
    """
    if rate_per_s <= 0:
        raise ConfigError("rate_per_s", f"must be positive, got {rate_per_s}")
    if burstiness <= 0:
        raise ConfigError("burstiness", f"must be positive, got {burstiness}")
    gaps = rng.gamma(shape=1.0 / burstiness, scale=burstiness / rate_per_s, size=int(n))
    return np.round(np.cumsum(gaps) * NS_PER_S).astype(np.int64)


def sharegpt_poisson(rate_per_s: float, n: int, *, seed: int, burstiness: float = 1.0,
                     path: str | os.PathLike[str] | None = None,
                     max_context: int = DEFAULT_MAX_CONTEXT) -> list[TraceRequest]:
    """n requests with ShareGPT lengths (drawn with replacement) and gamma inter-arrivals (see above)."""
    if n < 0:
        raise ConfigError("n", f"must be nonnegative, got {n}")
    rng = np.random.default_rng(seed)
    lengths = load_sharegpt_lengths(path)
    arrivals = gamma_arrivals_ns(rate_per_s, n, rng, burstiness)
    picks = rng.integers(0, len(lengths), size=int(n))
    return [TraceRequest(int(t), *clip_lengths(*lengths[j], max_context))
            for t, j in zip(arrivals, picks)]


DEFAULT_CLIENTS = (
    # One heavy client: 4x the rate of each light one and prompts 4x longer (outputs 2x).
    ClientSpec("heavy", rate_per_s=4.0, prompt_scale=4.0, output_scale=2.0),
    ClientSpec("light-1", rate_per_s=1.0),
    ClientSpec("light-2", rate_per_s=1.0),
    ClientSpec("light-3", rate_per_s=1.0),
)


def multi_client(clients: Sequence[ClientSpec] = DEFAULT_CLIENTS, *, duration_s: float = 60.0, seed: int = 0,
                 path: str | os.PathLike[str] | None = None,
                 max_context: int = DEFAULT_MAX_CONTEXT) -> list[TraceRequest]:
    """A fairness workload: each client an independent gamma process over [0, duration_s), tagged by name.

    Lengths are ShareGPT rows scaled by the client's prompt/output scale (then clipped). Each client has its
    own random stream derived from (seed, client index), so adding a client does not change the others.
    """
    names = [c.name for c in clients]
    if len(set(names)) != len(names):
        raise ConfigError("clients", f"client names must be unique, got {names}")
    if duration_s <= 0:
        raise ConfigError("duration_s", f"must be positive, got {duration_s}")
    lengths = load_sharegpt_lengths(path)
    limit_ns = int(duration_s * NS_PER_S)
    out: list[TraceRequest] = []
    for index, spec in enumerate(clients):
        rng = np.random.default_rng([seed, index])
        arrivals = _arrivals_until(spec, limit_ns, rng)
        picks = rng.integers(0, len(lengths), size=len(arrivals))
        for t, j in zip(arrivals, picks):
            p, o = lengths[j]
            out.append(TraceRequest(int(t), *clip_lengths(round(p * spec.prompt_scale),
                                                          round(o * spec.output_scale), max_context),
                                    client=spec.name))
    return _sorted(out)


def _arrivals_until(spec: ClientSpec, limit_ns: int, rng: np.random.Generator) -> np.ndarray:
    """The client's arrivals before limit_ns, drawing gaps in blocks until the window is covered."""
    block = max(16, int(spec.rate_per_s * limit_ns / NS_PER_S))
    parts, last = [], 0
    while True:
        chunk = gamma_arrivals_ns(spec.rate_per_s, block, rng, spec.burstiness) + last
        parts.append(chunk)
        last = int(chunk[-1])
        if last >= limit_ns:
            arrivals = np.concatenate(parts)
            return arrivals[arrivals < limit_ns]


def _sorted(requests: Iterable[TraceRequest]) -> list[TraceRequest]:
    # Stable: equal arrival times keep file order (Mooncake has many requests at the same millisecond).
    return sorted(requests, key=lambda r: r.arrival_ns)


def interarrival_cv2(requests: Sequence[TraceRequest]) -> float:
    """Squared coefficient of variation of the gaps between arrivals (1 for Poisson)."""
    t = np.array([r.arrival_ns for r in requests], dtype=np.float64)
    gaps = np.diff(t)
    if len(gaps) < 2 or gaps.mean() == 0:
        return float("nan")
    return float(gaps.var() / gaps.mean() ** 2)

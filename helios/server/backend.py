"""What `flare run` serves: a scheduler, a core and a tokenizer built from the command's options.

Two engines:
- "torch": TorchCore with the real model (the default: the embedded SmolLM2-135M-Instruct);
- "sim":   SimCore paced in real time with a byte-level tokenizer; it echoes each prompt's bytes
           cyclically, so HTTP tests are fast and deterministic without loading a model.
"""

from __future__ import annotations

import dataclasses
import pathlib
import threading
import time
from dataclasses import dataclass
from typing import Any

from helios.baselines import SCHEDULERS, make_scheduler
from helios.config import SchedulerConfig, SpeculationMode, preset
from helios.engine.sim_core import SimCore
from helios.errors import ConfigError
from helios.graphs import GraphKind, ordinary_catalog
from helios.prepare.speculative import with_speculation
from helios.server.warmup import WarmupReport, warm_up


@dataclass(frozen=True, slots=True)
class EngineOptions:
    """The model, scheduler and capacity options of `flare run` (validated by build_backend)."""

    engine: str = "torch"
    model: str | None = None
    scheduler: str = "helios"
    policy: str = "balanced"
    terminal_value: float | None = None
    terminal_age_price: float | None = None
    adaptive_verification_alpha: float | None = None
    speculation: str = "off"
    speculative_token_capacity: int = 16
    slots: int = 4
    prefill_capacity: int = 256
    max_context: int = 1024
    device: str = "cpu"
    sim_pace: float = 1.0  # sim engine: real seconds slept per simulated second
    warmup: bool = True  # torch engine: time every prepared graph before serving
    weights: str = "fp32"  # torch engine: fp32 (reference tokens) or int8 (faster, other tokens)


@dataclass(slots=True)
class Backend:
    """Everything the HTTP layer needs; build one with `build_backend`."""

    scheduler: Any
    core: Any
    tokenizer: Any
    model_id: str
    max_context: int
    slots: int
    vocab_size: int
    options: EngineOptions
    warmup: WarmupReport | None = None  # the torch engine's startup timings


def prefill_chunks(capacity: int) -> tuple[int, ...]:
    """Prefill graph capacities up to `capacity`: 64, 256, 1024, ... (powers of four) and it."""
    if capacity < 64 or capacity % 64:
        raise ConfigError("prefill_capacity", f"must be a positive multiple of 64, got {capacity}")
    chunks, c = {capacity}, 64
    while c < capacity:
        chunks.add(c)
        c *= 4
    return tuple(sorted(chunks))


def build_backend(options: EngineOptions) -> Backend:
    """Build the engine; ConfigError (naming the option) for any value it cannot serve."""
    if options.scheduler not in SCHEDULERS:
        raise ConfigError("scheduler", f"unknown scheduler {options.scheduler!r}; choose {', '.join(SCHEDULERS)}")
    policy = preset(options.policy, terminal_value=options.terminal_value,
                    terminal_age_price=options.terminal_age_price,
                    adaptive_verification_alpha=options.adaptive_verification_alpha)
    try:
        speculation = SpeculationMode(options.speculation)
    except ValueError:
        raise ConfigError("speculation", f"choose off, fixed or adaptive, got {options.speculation!r}") from None
    if options.slots > 64:
        raise ConfigError("slots", "selection is bounded to 64 request slots")
    chunks = prefill_chunks(options.prefill_capacity)
    if options.prefill_capacity > options.max_context:
        raise ConfigError("prefill_capacity", f"{options.prefill_capacity} exceeds --max-context {options.max_context}")
    if options.engine == "sim":
        return _sim_backend(options, policy, speculation, chunks)
    if options.engine == "torch":
        return _torch_backend(options, policy, speculation, chunks)
    raise ConfigError("engine", f"choose torch or sim, got {options.engine!r}")


def _scheduler(options, catalog, policy, config):
    try:
        return make_scheduler(options.scheduler, catalog, policy, config)
    except ConfigError as exc:
        if exc.field != "catalog":
            raise
        # Baselines schedule ordinary decode and prefill only.
        raise ConfigError("scheduler", f"{options.scheduler} cannot serve this catalog ({exc}); "
                                       f"use --speculation off or --scheduler helios") from None


def _torch_backend(options, policy, speculation, chunks) -> Backend:
    import torch

    from helios.engine.model import default_model_path
    from helios.engine.torch_core import TorchCore

    try:
        device = torch.device(options.device)
    except RuntimeError:
        raise ConfigError("device", f"not a torch device: {options.device!r}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device", "CUDA is not available on this machine")

    path = pathlib.Path(options.model) if options.model else default_model_path()
    if not path.is_file():
        raise ConfigError("model", f"no such model file: {path}")
    core = TorchCore(path, request_slots=options.slots, max_context=options.max_context, prefill_chunks=chunks,
                     max_batch=options.slots, speculation=speculation,
                     speculative_token_capacity=options.speculative_token_capacity, device=options.device,
                     weights=options.weights)
    scheduler = _scheduler(options, core.catalog, policy, core.scheduler_config())
    # Steady-state timings of every prepared graph seed the cost table (helios.server.warmup).
    report = warm_up(scheduler, core) if options.warmup else None
    # "SmolLM2-135M-Instruct.Q4_1.gguf" -> "SmolLM2-135M-Instruct"
    model_id = path.name.split(".")[0] or path.stem
    return Backend(scheduler, core, core.tokenizer, model_id, core.max_context, options.slots,
                   core.tokenizer.vocab_size, options, report)


def _sim_backend(options, policy, speculation, chunks) -> Backend:
    catalog = ordinary_catalog(max_batch=options.slots, prefill_chunks=chunks)
    if speculation is not SpeculationMode.OFF:
        # Adaptive sim rounds include ragged programs, so the device-allocation path is served too.
        catalog = with_speculation(catalog, options.slots, (1, 2, 4), options.speculative_token_capacity,
                                   ragged=speculation is SpeculationMode.ADAPTIVE)
    depth = max((s.proposal_depth for s in catalog.of_kind(GraphKind.SPECULATIVE)), default=0)
    config = SchedulerConfig(request_slots=options.slots, max_context=options.max_context,
                             speculation=speculation, draft_capacity=depth or 8,
                             selection_slots=options.slots)
    scheduler = _scheduler(options, catalog, policy, config)
    tokenizer = ByteTokenizer()
    core = EchoSimCore(catalog, options.sim_pace, tokenizer.eos_id, options.slots, depth or 8)
    return Backend(scheduler, core, tokenizer, "helios-sim", options.max_context, options.slots,
                   tokenizer.vocab_size, options)


class ByteTokenizer:
    """Token id = byte value, plus an EOS id (256); a ChatML-like template."""

    eos_id = 256
    vocab_size = 257

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

    def token_bytes(self, token_id: int) -> bytes:
        return bytes([token_id]) if token_id < 256 else b""

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        text = "".join(f"<|{m['role']}|>{m['content']}\n" for m in messages)
        return text + ("<|assistant|>" if add_generation_prompt else "")


class _AffineCost:
    """decode ms = 2 + 0.05 B (+0.5 per extra verified position); prefill ms = 2 + 0.01 B C."""

    def duration_ns(self, shape, context_lens) -> int:
        b = shape.batch_capacity
        if shape.kind.is_prefill:
            ms = 2 + 0.01 * b * shape.token_capacity
        else:
            ms = 2 + 0.05 * b + 0.5 * (shape.token_capacity - 1)
        return int(ms * 1e6)


class EchoSimCore(SimCore):
    """SimCore paced in real time whose output tokens repeat the prompt's bytes cyclically
    (timing, acceptance and round sizes stay SimCore's)."""

    def __init__(self, catalog, pace: float, eos_id: int, slots: int, draft_capacity: int):
        super().__init__(catalog, _AffineCost(), seed=0, vocab=256, eos_id=eos_id,
                         request_slots=slots, draft_capacity=draft_capacity)
        self.pace = pace
        self._prompts: dict[int, tuple[list[int], int]] = {}
        self._lock = threading.Lock()

    def attach(self, handle, prompt=0, **options) -> None:
        super().attach(handle, prompt)
        ids = [int(t) for t in prompt if int(t) < 256] or [ord("x")]
        self._prompts[handle] = (ids, 0)

    def detach(self, handle) -> None:
        super().detach(handle)
        self._prompts.pop(handle, None)

    def execute(self, plan, fence):
        with self._lock:
            execution = super().execute(plan, fence)
            records = tuple(dataclasses.replace(r, tokens=self._echo(r.handle, len(r.tokens)))
                            for r in execution.records)
        if self.pace:
            time.sleep(execution.duration_ns * self.pace / 1e9)
        return dataclasses.replace(execution, records=records)

    def _echo(self, handle, n: int) -> tuple[int, ...]:
        ids, pos = self._prompts.get(handle, ([ord("x")], 0))
        out = tuple(ids[(pos + i) % len(ids)] for i in range(n))
        self._prompts[handle] = (ids, pos + n)
        return out

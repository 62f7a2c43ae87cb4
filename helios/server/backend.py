"""What `flare run` serves: a scheduler, a core and a tokenizer built from the command's options.

Startup, top-down: validate the options -> the engine's capacities (helios.prepare.Capacities) ->
the core, which builds its catalog from them (helios.prepare.build_catalog) -> the scheduler on
the core's catalog -> warm-up timings seed its costs -> Backend. Two engines:
- "torch": TorchCore with the real model (the default: the embedded SmolLM2-135M-Instruct);
- "sim":   EchoSimCore (helios.engine.echo_core), SimCore paced in real time with a byte-level
           tokenizer; it echoes each prompt's bytes cyclically, so HTTP tests are fast and
           deterministic without loading a model.
"""

from __future__ import annotations

import dataclasses
import pathlib
from dataclasses import dataclass
from typing import Any

from helios.baselines import SCHEDULERS, make_scheduler
from helios.config import PreemptionConfig, SpeculationMode, preset, study_preset
from helios.engine.echo_core import EchoSimCore
from helios.errors import ConfigError
from helios.graphs import GraphKind
from helios.prepare import Capacities, prefill_chunks
from helios.prepare.mixed import PROMPT_STEPS
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
    adaptation_ms: float | None = None  # the policy's rate time constant (None: the preset's)
    speculation: str = "off"
    speculative_token_capacity: int = 16
    slots: int = 4
    prefill_capacity: int = 256
    max_context: int = 1024
    device: str = "cpu"
    sim_pace: float = 1.0  # sim engine: real seconds slept per simulated second
    warmup: bool = True  # torch engine: time every prepared graph before serving
    # torch engine: gguf (the file's quantized weights), fp32 (reference tokens), bf16 or int8 (faster,
    # other tokens); None: gguf on one CPU rank, fp32 elsewhere (weight_format)
    weights: str | None = "fp32"
    tensor_parallel: int = 1  # torch engine: ranks (helios.engine.tensor_parallel)
    mixed_prefill: bool = False  # also prepare mixed prefill+decode graphs (helios.prepare)
    mixed_prompt_steps: int = PROMPT_STEPS  # their prompt buckets per factor of four (helios.prepare.mixed)
    mixed_prompt_capacity: int | None = None  # their largest prompt chunk (None: --prefill-capacity)
    mixed_prompt_rows: int = 1  # rows sharing a mixed graph's prompt capacity (docs/packed-prompt-rows.md)
    scored_prefill: bool = True  # also prepare scored prefill graphs: the prompt's log-probabilities
    # torch engine: host memory for conversation checkpoints (SNAPSHOT/RESTORE graphs); 0 disables.
    checkpoint_memory_mib: int = 2048
    # Automatic preemption (helios.scheduler.preemption) with the Helios scheduler: "price" or
    # "off". It acts only where the catalog has snapshot and restore graphs (the torch engine
    # with a checkpoint store); None knobs keep PreemptionConfig's defaults.
    preemption: str = "price"
    preemption_quantum_ms: float | None = None
    preemption_price_ratio: float | None = None
    # A client's share of the running slots (helios.scheduler.slot_share), Helios scheduler only.
    slot_share: bool = True
    # Outside the spec, off by default: StudyConfig.class_gap_bound (Helios scheduler only).
    class_gap_bound: float | None = None


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
    # --served-model-name: the names clients may send as `model` (the first is model_id); empty: model_id only.
    served_names: tuple[str, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        return self.served_names or (self.model_id,)

    def describe_catalog(self) -> str:
        """The startup planning line: prepared graphs by kind and, with mixed graphs, the largest
        packed extent among them (the most tokens one mixed forward carries)."""
        return describe_catalog(self.core.catalog)

    def describe_engine(self) -> str | None:
        """The CPU engine's startup line (None for other engines and devices)."""
        return describe_engine(self.core, self.options)


def weight_format(options) -> str:
    """`--weights`, or its default (`default_weights`)."""
    if options.weights is not None:
        return options.weights
    return default_weights(options.device, options.tensor_parallel, options.model)


def default_weights(device: str, tensor_parallel: int, model: str | None) -> str:
    """The file's own quantized weights for a GGUF on one CPU rank; fp32 elsewhere (tensor
    parallelism shards fp32 weights, other devices have no kernel for them, and a Hugging Face
    directory holds no GGUF blocks)."""
    gguf = model is None or not pathlib.Path(model).is_dir()
    return "gguf" if gguf and device.split(":")[0] == "cpu" and tensor_parallel == 1 else "fp32"


def describe_cpu_engine(weights: str, threads: int, bf16_native: bool) -> str:
    """The startup line of the CPU engine: weight format, torch threads, and the faster format this
    CPU could run (docs/server.md, "CPU threads" and `--weights`)."""
    text = (f"{weights} weights on up to {threads} CPU thread{'s' * (threads != 1)} "
            f"(fewer while other processes use the CPUs)")
    if weights == "fp32" and bf16_native:
        text += "; this CPU multiplies bfloat16 natively: --weights bf16 is about 1.5x faster (other tokens)"
    return text


def describe_catalog(catalog) -> str:
    kinds: dict[str, int] = {}
    for shape in catalog:
        kinds[shape.kind.value] = kinds.get(shape.kind.value, 0) + 1
    text = f"catalog of {len(catalog)} graphs: " + ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
    mixed = catalog.of_kind(GraphKind.MIXED)
    if mixed:
        # C + (B - 1) W: one full prompt row plus full decode rows.
        extent = max(s.prefill_capacity + (s.batch_capacity - 1) * s.token_capacity for s in mixed)
        text += f"; maximum packed extent {extent} tokens"
    return text


def build_backend(options: EngineOptions, log=None) -> Backend:
    """Build the engine; ConfigError (naming the option) for any value it cannot serve. `log`
    (helios.server.startup.StartupLog) gets each stage's line as it begins."""
    if options.scheduler not in SCHEDULERS:
        raise ConfigError("scheduler", f"unknown scheduler {options.scheduler!r}; choose {', '.join(SCHEDULERS)}")
    policy = preset(options.policy, terminal_value=options.terminal_value,
                    terminal_age_price=options.terminal_age_price,
                    adaptive_verification_alpha=options.adaptive_verification_alpha)
    if options.adaptation_ms is not None:  # PolicyConfig checks it (ConfigError "adaptation_ms")
        policy = dataclasses.replace(policy, adaptation_ms=options.adaptation_ms)
    try:
        speculation = SpeculationMode(options.speculation)
    except ValueError:
        raise ConfigError("speculation", f"choose off, fixed or adaptive, got {options.speculation!r}") from None
    if isinstance(options.checkpoint_memory_mib, bool) or not isinstance(options.checkpoint_memory_mib, int) \
            or options.checkpoint_memory_mib < 0:
        raise ConfigError("checkpoint_memory_mib", f"must be a nonnegative integer, got {options.checkpoint_memory_mib!r}")
    if options.slots > 64:
        raise ConfigError("slots", "selection is bounded to 64 request slots")
    chunks = prefill_chunks(options.prefill_capacity)
    if options.prefill_capacity > options.max_context:
        raise ConfigError("prefill_capacity", f"{options.prefill_capacity} exceeds --max-context {options.max_context}")
    if options.engine == "sim":
        # Adaptive sim rounds include ragged programs, so the device-allocation path is served too.
        capacities = Capacities(options.slots, chunks, speculation=speculation, widths=(1, 2, 4),
                                speculative_token_capacity=options.speculative_token_capacity,
                                ragged=speculation is SpeculationMode.ADAPTIVE, scored_prefill=options.scored_prefill,
                                **({"mixed_prefill": True, "mixed_prompt_steps": options.mixed_prompt_steps,
                                    "mixed_prompt_capacity": options.mixed_prompt_capacity,
                                    "mixed_prompt_rows": options.mixed_prompt_rows}
                                   if options.mixed_prefill else {}))
        core, model_id = EchoSimCore(capacities, request_slots=options.slots, max_context=options.max_context,
                                     pace=options.sim_pace), "helios-sim"
    elif options.engine == "torch":
        core, model_id = _torch_core(options, speculation, chunks, log)
    else:
        raise ConfigError("engine", f"choose torch or sim, got {options.engine!r}")
    scheduler = _scheduler(options, core.catalog, policy, _with_preemption(options, core.scheduler_config()))
    # Steady-state timings of every prepared graph seed the cost table (helios.server.warmup).
    report = _warm_up(scheduler, core, log, options) if options.warmup and options.engine == "torch" else None
    if getattr(core, "grammars", False):
        core.prepare_grammars()  # before serving, not in line with the first constrained request's frames
    return Backend(scheduler, core, core.tokenizer, model_id, core.max_context, options.slots,
                   core.tokenizer.vocab_size, options, report)


def _warm_up(scheduler, core, log, options) -> WarmupReport:
    if log is None:
        return warm_up(scheduler, core)
    log.step(describe_catalog(core.catalog))
    if (engine := describe_engine(core, options)) is not None:
        log.step(engine)
    log.step(f"warm-up: timing {len(core.catalog)} graphs (--no-warmup skips it)")
    progress = log.warmup()
    try:
        report = warm_up(scheduler, core, progress=progress)
    finally:
        progress.close()
    for line in report.describe_lines():
        log.line(line)
    return report


def describe_engine(core, options) -> str | None:
    torch_thread = getattr(core, "torch_thread", None)
    if torch_thread is None:
        return None
    from helios.engine.model.weights import bf16_available

    return describe_cpu_engine(weight_format(options), torch_thread.most, bf16_available())


def _with_preemption(options, config):
    """The core's scheduler config with `--preemption` and its knobs (ConfigError names the bad
    one) and `--slot-share`. Baselines never preempt, so only the Helios scheduler gets them."""
    knobs = {"quantum_ms": options.preemption_quantum_ms, "price_ratio": options.preemption_price_ratio}
    preemption = PreemptionConfig(options.preemption, **{k: v for k, v in knobs.items() if v is not None})
    if options.scheduler != "helios":
        return config
    return dataclasses.replace(config, preemption=preemption, slot_share=options.slot_share)


def _scheduler(options, catalog, policy, config):
    try:
        if options.scheduler == "helios":  # the preset's study switches, and --class-gap-bound
            study = dataclasses.replace(study_preset(options.policy), class_gap_bound=options.class_gap_bound)
            return make_scheduler("helios", catalog, policy, config, study=study)
        if options.class_gap_bound is not None:
            raise ConfigError("class_gap_bound", f"applies to --scheduler helios only, not {options.scheduler}")
        return make_scheduler(options.scheduler, catalog, policy, config)
    except ConfigError as exc:
        if exc.field != "catalog":
            raise
        # Baselines schedule ordinary decode and prefill only.
        raise ConfigError("scheduler", f"{options.scheduler} cannot serve this catalog ({exc}); "
                                       f"use --speculation off or --scheduler helios") from None


def check_device(name: str) -> None:
    """ConfigError("device") unless `name` is a torch device this machine has."""
    import torch

    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError("device", f"not a torch device: {name!r}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device", "CUDA is not available on this machine")


def _torch_core(options, speculation, chunks, log=None):
    """TorchCore on the chosen device and model file (it declares its capacities from these
    options and builds its catalog from them), and the model id it is served under."""
    from helios.engine.model import default_model_path
    from helios.engine.torch_core import TorchCore

    check_device(options.device)
    path = pathlib.Path(options.model) if options.model else default_model_path()
    if not (path.is_file() or path.is_dir()):  # a GGUF file or a Hugging Face directory
        raise ConfigError("model", f"no such model file: {path}")
    if log is not None:
        log.step(f"loading {path.name} ({weight_format(options)} weights, {options.slots} slots x "
                 f"{options.max_context} tokens) and preparing its graphs")
    kwargs = dict(request_slots=options.slots, max_context=options.max_context, prefill_chunks=chunks,
                  max_batch=options.slots, speculation=speculation,
                  speculative_token_capacity=options.speculative_token_capacity, device=options.device,
                  mixed_prefill=options.mixed_prefill, mixed_prompt_steps=options.mixed_prompt_steps,
                  mixed_prompt_capacity=options.mixed_prompt_capacity, scored_prefill=options.scored_prefill,
                  **({"mixed_prompt_rows": options.mixed_prompt_rows} if options.mixed_prompt_rows != 1 else {}))
    if options.tensor_parallel > 1:
        from helios.engine.tensor_parallel import TensorParallelCore

        if weight_format(options) != "fp32":
            raise ConfigError("weights", "tensor parallelism shards fp32 weights only")
        if options.engine != "torch":
            raise ConfigError("tensor_parallel", "needs --engine torch")
        core = TensorParallelCore(options.tensor_parallel, path, **kwargs)
    else:
        core = TorchCore(path, weights=weight_format(options), checkpoint_memory=options.checkpoint_memory_mib << 20,
                         **kwargs)
    # "SmolLM2-135M-Instruct.Q4_1.gguf" -> "SmolLM2-135M-Instruct"; a directory keeps its name.
    return core, path.name if path.is_dir() else path.name.split(".")[0] or path.stem

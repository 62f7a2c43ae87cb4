"""`flare run`: its flags and the command. Every invalid value exits with status 2 and one line
that names the flag."""

from __future__ import annotations

import argparse
import math
import sys

from helios.baselines import SCHEDULERS
from helios.cli_help import DefaultsHelp, groups_first
from helios.errors import ConfigError
from helios.server.hardening_cli import add_hardening_arguments, hardening_settings

# ConfigError.field (from config, backend or core) -> the flag that sets it.
_FLAGS = {
    "scheduler_policy": "--scheduler-policy", "terminal_value": "--scheduler-terminal-value",
    "terminal_age_price": "--scheduler-terminal-age-price",
    "adaptive_verification_alpha": "--mtp-adaptive-verification-alpha",
    "adaptation_ms": "--scheduler-adaptation-ms",
    "scheduler": "--scheduler",
    "checkpoint_memory_mib": "--checkpoint-memory",
    "speculation": "--speculation", "speculative_token_capacity": "--speculative-token-capacity",
    "token_capacity": "--speculative-token-capacity", "slots": "--slots", "request_slots": "--slots",
    "max_batch": "--slots", "prefill_capacity": "--prefill-capacity", "prefill_chunks": "--prefill-capacity",
    "max_context": "--max-context", "model": "--model", "engine": "--engine", "device": "--device",
    "weights": "--weights", "tensor_parallel": "--tensor-parallel", "preemption": "--preemption",
    "mixed_prompt_steps": "--mixed-prompt-steps", "mixed_prompt_capacity": "--mixed-prompt-capacity",
    "mixed_prompt_rows": "--mixed-prompt-rows", "class_gap_bound": "--class-gap-bound",
    "preemption_quantum_ms": "--preemption-quantum-ms", "preemption_price_ratio": "--preemption-price-ratio",
    "chat_template": "--chat-template",
}


def _number(kind, test, what):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if not test(value):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return value
    return parse


positive_int = _number(int, lambda v: v > 0, "a positive integer")
nonnegative_int = _number(int, lambda v: v >= 0, "a nonnegative integer")
port_number = _number(int, lambda v: 0 <= v <= 65535, "a port number in [0, 65535]")
nonnegative_float = _number(float, lambda v: math.isfinite(v) and v >= 0, "a finite nonnegative number")
positive_float = _number(float, lambda v: math.isfinite(v) and v > 0, "a finite number greater than zero")
_share = _number(float, lambda v: 0 < v <= 1, "a fraction in (0, 1]")
_ratio = _number(float, lambda v: math.isfinite(v) and v >= 1, "a finite number of at least 1")


def add_arguments(run: argparse.ArgumentParser) -> None:
    """The `flare run` flags (defaults: embedded SmolLM2, Helios balanced, 127.0.0.1:8000, slots and
    context sized for this machine by helios.server.sizing)."""
    prog = run.prog

    def error(message: str):  # argparse prints usage too; a one-line error is easier to read
        print(f"{prog}: error: {message}", file=sys.stderr)
        sys.exit(2)

    run.error = error
    run.formatter_class = DefaultsHelp
    run.usage = "%(prog)s [--model PATH] [--served-model-name NAME ...] [--port PORT] [--slots N] [options]"
    run.description = ("Serve an OpenAI-compatible API (and vLLM's /tokenize, /detokenize, /version). The first "
                       "group holds what operators set; the last holds the scheduler's study switches, whose "
                       "defaults are the spec's.")
    o = run.add_argument_group("server")
    g = run.add_argument_group("engine")
    o.add_argument("--model", metavar="PATH",
                   help="a Llama GGUF file, or a Hugging Face model directory (Llama or Qwen2; config.json, "
                        "*.safetensors, tokenizer.json); default: the embedded SmolLM2-135M-Instruct")
    o.add_argument("--served-model-name", nargs="+", metavar="NAME",
                   help="the names clients may send as `model` (the first is the one responses carry); "
                        "default: the model file's name")
    o.add_argument("--chat-template", metavar="FILE_OR_TEXT",
                   help="a Jinja chat template (a file, or the template itself) instead of the model's")
    g.add_argument("--engine", choices=("torch", "sim"), default="torch",
                   help="torch: the real model; sim: SimCore with a byte tokenizer, for testing the HTTP layer")
    o.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda")
    o.add_argument("--weights", choices=("gguf", "fp32", "bf16", "int8"),
                   help="gguf (default for a GGUF file on the CPU): the file's own quantized weights, as llama.cpp "
                        "serves them; fp32: dequantized to float32, the reference tokens (default elsewhere); bf16 "
                        "(CPUs with AMX or AVX512-BF16) and int8: other faster linears (docs/server.md)")
    o.add_argument("--slots", type=positive_int,
                   help="request slots, at most 64 (default: as many as fit 40%% of memory, see docs/server.md)")
    g.add_argument("--prefill-capacity", type=positive_int, default=256,
                   help="largest prefill chunk in tokens, a multiple of 64 (default 256); the chunks "
                        "64, 256, 1024, ... below it are prepared too")
    o.add_argument("--max-context", type=positive_int,
                   help="context tokens per request, prompt and output (default: the model's, at most 4096)")
    g.add_argument("--tensor-parallel", type=positive_int, default=1, metavar="N",
                   help="torch engine: shard the model over N ranks (torch.distributed; gloo on the CPU, "
                        "NCCL on CUDA); ranks 1..N-1 are spawned processes (docs/scale-out.md)")
    g.add_argument("--speculation", choices=("off", "fixed", "adaptive"), default="off",
                   help="speculative decoding with copy proposals (default off)")
    g.add_argument("--speculative-token-capacity", type=positive_int, default=16,
                   help="R: aggregate target rows of a speculative program (default 16)")
    g.add_argument("--no-scored-prefill", dest="scored_prefill", action="store_false",
                   help="do not prepare scored prefill graphs (logits at every prompt position), which serve "
                        "the prompt's log-probabilities (echo with logprobs); they run only for such requests")
    g.add_argument("--mixed-prefill", action="store_true",
                   help="also prepare mixed graphs: one prompt chunk and the decode rows in one forward")
    g.add_argument("--mixed-prompt-steps", type=positive_int, default=3, metavar="N",
                   help="with --mixed-prefill: prompt buckets per factor of four up to --prefill-capacity "
                        "(default 3, the spec's ladder; more buckets pad a prompt's last chunk less, and "
                        "change nothing below 256 tokens)")
    g.add_argument("--mixed-prompt-capacity", type=positive_int, metavar="TOKENS",
                   help="with --mixed-prefill: the largest prompt chunk of a mixed graph, a multiple of 64 up to "
                        "--prefill-capacity (default: --prefill-capacity); longer chunks run in prefill graphs")
    g.add_argument("--mixed-prompt-rows", type=positive_int, default=1, metavar="R",
                   help="with --mixed-prefill: rows of a mixed graph that may share its prompt capacity as one "
                        "packed budget (default 1, the spec's one prompt row; docs/packed-prompt-rows.md)")
    g.add_argument("--checkpoint-memory", type=nonnegative_int, default=2048, metavar="MIB",
                   help="torch engine: host memory for conversation checkpoints, in MiB (default 2048, about "
                        "45k SmolLM2 tokens); a chat turn that extends a stored conversation restores it "
                        "instead of re-prefilling; 0 disables")
    g.add_argument("--no-warmup", dest="warmup", action="store_false",
                   help="skip timing every prepared graph at startup (costs are then discovered on demand)")
    g = run.add_argument_group(_INTERNALS)
    g.add_argument("--scheduler", choices=tuple(SCHEDULERS), default="helios", help="Helios or a baseline")
    g.add_argument("--scheduler-policy", choices=("balanced", "throughput", "spec"), default="balanced",
                   help="balanced (default): the spec's coefficients with the measured deviations of "
                        "docs/scheduling-utility.md; throughput: no cadence preferences; spec: the spec's table exactly")
    g.add_argument("--scheduler-terminal-value", type=nonnegative_float, metavar="VALUE",
                   help="value per terminal retirement (0 disables)")
    g.add_argument("--scheduler-terminal-age-price", type=nonnegative_float, metavar="PRICE",
                   help="terminal-wait cost coefficient (0 disables)")
    g.add_argument("--scheduler-adaptation-ms", type=positive_float, metavar="MS",
                   help="time constant of the scheduler's service rates (default: the policy's, 50 ms); "
                        "on a CPU where one decode graph takes longer than it, larger values let "
                        "ready streams share bigger decode batches (docs/server.md)")
    g.add_argument("--preemption", choices=("price", "off"), default="price",
                   help="price (default): when every slot (or the page pool) is held by running generations, a "
                        "waiting request whose fairness price grew --preemption-price-ratio times above a "
                        "generation's, and that asks for fewer tokens than it still has to produce, has that "
                        "generation paused (snapshot) and resumed later (restore) with the same tokens; needs "
                        "the checkpoint store (--checkpoint-memory > 0) and --scheduler helios; off: never")
    g.add_argument("--preemption-quantum-ms", type=nonnegative_float, metavar="MS",
                   help="a request holds its slot at least this long before it may be paused (default 500)")
    g.add_argument("--preemption-price-ratio", type=_ratio, metavar="R",
                   help="how many times a waiting request's fairness price must exceed a running one's before "
                        "it may pause it (>= 1, default 4: about adaptation-ms x ln 4 of waiting)")
    g.add_argument("--slot-share", choices=("fair", "off"), default="fair",
                   help="fair (default): while requests of several clients (`user`, else the address) wait, slots "
                        "are shared max-min fairly among clients: free slots go first to the clients holding "
                        "fewest, and with preemption on a waiting request pauses a running generation of a client "
                        "that would still hold at least as many; a lone client still uses every slot. off: "
                        "requests compete for slots by price alone (docs/server.md, \"Bad clients\")")
    g.add_argument("--class-gap-bound", type=float, metavar="F",
                   help="off by default (outside the spec): never run a prompt-bearing graph that would hold a "
                        "streaming request past F (0 < F <= 1) times the gap target its service class states "
                        "(--service-classes); classes without a gap target are not bounded "
                        "(docs/server.md, \"Service classes\")")
    g.add_argument("--mtp-adaptive-verification-alpha", type=positive_float, metavar="ALPHA",
                   help="exponent on prefix-survival estimates in speculative scores (> 0, default 1)")
    g = run.add_argument_group("HTTP limits")
    o.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    o.add_argument("--port", type=port_number, default=8000, help="0 picks a free port")
    g.add_argument("--max-queue", type=nonnegative_int, default=32,
                   help="requests admitted beyond the slots before answering 429 (default 32)")
    g.add_argument("--max-body-bytes", type=positive_int, default=2 * 1024 * 1024,
                   help="larger request bodies get 413")
    g.add_argument("--service-classes", metavar="PATH",
                   help="service classes and tenants, TOML or JSON (docs/server.md); default: the built-in "
                        "default, interactive, standard and batch")
    g.add_argument("--class-field", choices=("service_tier", "priority", "user"), default="service_tier",
                   help="the request field that selects the class (default service_tier)")
    g.add_argument("--shutdown-grace", type=nonnegative_float, default=5.0, metavar="SECONDS",
                   help="on SIGTERM, in-flight requests may finish for this long, then are cancelled")
    g.add_argument("--sim-pace", type=nonnegative_float, default=1.0, help=argparse.SUPPRESS)
    o.add_argument("--log-level", choices=("critical", "error", "warning", "info", "debug"), default="warning",
                   help="info: one line per finished request and a status line while busy; debug: also "
                        "uvicorn's access log")
    o.add_argument("--log-status-every", type=nonnegative_float, default=5.0, metavar="SECONDS",
                   help="at --log-level info, the status line's interval while requests run (0: none)")
    add_hardening_arguments(run, _share, positive_float, positive_int)
    groups_first(run, _INTERNALS)  # operators' groups first, the study switches last


_INTERNALS = "scheduler internals (study switches; the defaults are the spec's)"


def class_policy(path: str | None, class_field: str):
    """The server's ClassPolicy: the class table of `path` (built-ins when None) and the selecting field."""
    from helios.class_table import load_class_table
    from helios.server.service_classes import ClassPolicy

    return ClassPolicy(load_class_table(path), class_field) if path else ClassPolicy(field=class_field)


def run(args: argparse.Namespace) -> int:
    """Build the engine, serve until SIGTERM/SIGINT; 2 for invalid options, 1 for other failures."""
    from helios.server.backend import EngineOptions, build_backend, default_weights
    from helios.server.openmp import choose_wait_policy
    from helios.server.preflight import preflight
    from helios.server.chat_template import TemplatedTokenizer, load_chat_template
    from helios.server.sizing import SIM_CONTEXT, SIM_SLOTS, resolve
    from helios.server.startup import StartupLog

    try:
        classes = class_policy(args.service_classes, args.class_field)
    except ConfigError as exc:
        print(f"flare run: error: --service-classes: {exc}", file=sys.stderr)
        return 2
    log = StartupLog()
    choose_wait_policy()
    try:
        # The model file's header (architecture, memory) and the flag combinations are checked
        # before torch or the weights load: a refusal comes within about a second.
        weights = args.weights or default_weights(args.device, args.tensor_parallel, args.model)
        capacity = resolve(args.engine, args.model, args.slots, args.max_context, weights)
        options = EngineOptions(
            engine=args.engine, model=args.model, scheduler=args.scheduler, policy=args.scheduler_policy,
            terminal_value=args.scheduler_terminal_value, terminal_age_price=args.scheduler_terminal_age_price,
            adaptive_verification_alpha=args.mtp_adaptive_verification_alpha,
            adaptation_ms=args.scheduler_adaptation_ms,
            speculation=args.speculation,
            speculative_token_capacity=args.speculative_token_capacity,
            slots=capacity.slots if capacity else args.slots or SIM_SLOTS,
            prefill_capacity=args.prefill_capacity,
            max_context=capacity.max_context if capacity else args.max_context or SIM_CONTEXT,
            device=args.device, sim_pace=args.sim_pace, warmup=args.warmup, weights=weights,
            tensor_parallel=args.tensor_parallel, mixed_prefill=args.mixed_prefill,
            mixed_prompt_steps=args.mixed_prompt_steps, mixed_prompt_capacity=args.mixed_prompt_capacity,
            mixed_prompt_rows=args.mixed_prompt_rows,
            scored_prefill=args.scored_prefill,
            slot_share=args.slot_share == "fair", class_gap_bound=args.class_gap_bound,
            checkpoint_memory_mib=args.checkpoint_memory, preemption=args.preemption,
            preemption_quantum_ms=args.preemption_quantum_ms, preemption_price_ratio=args.preemption_price_ratio)
        template = load_chat_template(args.chat_template) if args.chat_template else None
        preflight(options)
        if capacity is not None:
            log.step(capacity.describe())
        backend = build_backend(options, log=log if options.engine == "torch" else None)
    except ConfigError as exc:
        flag = _FLAGS.get(exc.field)
        detail = str(exc).split(": ", 1)[-1]
        print(f"flare run: error: {flag}: {detail}" if flag else f"flare run: error: {exc}", file=sys.stderr)
        return 2
    except FileNotFoundError as exc:
        print(f"flare run: error: --model: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # a model that does not load, a device that is not there
        print(f"flare run: error: could not start the engine: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    if args.served_model_name:  # the first name is the one responses carry
        backend.model_id, backend.served_names = args.served_model_name[0], tuple(args.served_model_name)
    if template is not None:
        backend.tokenizer = TemplatedTokenizer(backend.tokenizer, template)
    if backend.warmup is None:  # with a warm-up, these lines came as it began
        log.step(backend.describe_catalog())
        if (engine := backend.describe_engine()) is not None:
            log.step(engine)
    from helios.server.app import ServerSettings  # the HTTP stack: after the checks and the model
    from helios.server.serve import serve

    settings = ServerSettings(max_queue=args.max_queue, max_body_bytes=args.max_body_bytes,
                              shutdown_grace_s=args.shutdown_grace, classes=classes, **hardening_settings(args))
    try:
        return serve(backend, settings, args.host, args.port, log_level=args.log_level,
                     status_every_s=args.log_status_every)
    finally:
        close = getattr(backend.core, "close", None)
        if close is not None:  # tensor parallelism: stop the spawned ranks
            close()

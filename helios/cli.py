"""`flare`: run (serve), sim (simulate) and bench (scheduler overhead)."""

from __future__ import annotations

import argparse
import sys

from helios.cli_help import DefaultsHelp


def _sim(args: argparse.Namespace) -> int:
    from helios.sim.demo import run_demo

    if getattr(args, "sim_command", None) == "report":
        return _sim_report(args)
    if getattr(args, "sim_command", None) in ("run", "explain"):
        from helios.sim.explain_cli import run_command

        return run_command(args)
    if not args.demo:
        print("flare sim: choose --demo (trace-driven runs arrive with `flare sim report`)", file=sys.stderr)
        return 2
    run_demo(requests=args.requests, seed=args.seed, steps=args.steps, mixed_prefill=args.mixed_prefill,
             mixed_prompt_rows=args.mixed_prompt_rows)
    return 0


def _sim_report(args: argparse.Namespace) -> int:
    import shlex
    import time
    from dataclasses import replace

    from helios.errors import ConfigError
    from helios.sim.experiment import setup_from_flags
    from helios.sim.report import ReportConfig, quick, run_report
    from helios.sim.report_tasks import Interrupted

    cost_model = args.cost_model
    try:
        if args.profile:  # the model shape: flags, else DIR/model.json, else the defaults; printed
            cost_model = _profile_cost_model(args)
        setup = setup_from_flags(cost_model=cost_model, mixed_prefill=args.mixed_prefill,
                                 mixed_prompt_steps=args.mixed_prompt_steps,
                                 mixed_prompt_capacity=args.mixed_prompt_capacity,
                                 mixed_prompt_rows=args.mixed_prompt_rows,
                                 prefill_capacity=args.prefill_capacity)
    except ConfigError as exc:
        print(f"flare sim report: {exc}", file=sys.stderr)
        return 2
    if args.workload:
        return _sim_mix_report(args, setup)
    cfg = ReportConfig(setup=setup)
    if args.quick:
        cfg = quick(cfg)
    traces = args.traces
    if args.trace:  # user trace files: named format if given, else detected from the file
        files = [f"{args.trace_format}:{p}" if args.trace_format else p for p in args.trace]
        traces = [*(traces or []), *files]
    # Options given explicitly win over the defaults and over --quick.
    given = {"traces": traces, "schedulers": args.schedulers, "window_s": args.window_s, "loads": args.loads,
             "jobs": args.jobs, "seeds": args.seeds, "min_requests": args.min_requests,
             "resolution": args.resolution, "ablation": args.ablation, "prefix_reuse": args.prefix_reuse,
             "sweep": args.sweep, "refine": args.refine}
    cfg = replace(cfg, **{k: tuple(v) if isinstance(v, list) else v for k, v in given.items() if v})
    t0 = time.perf_counter()
    try:
        path = run_report(cfg, args.out, command="flare " + shlex.join(args.argv))
    except (ConfigError, FileNotFoundError) as exc:  # bad names or missing data: say so, no traceback
        print(f"flare sim report: {exc}", file=sys.stderr)
        return 2
    except Interrupted as stop:  # Ctrl-C: the workers are stopped; the finished tasks are kept
        print(f"\nflare sim report: interrupted after {len(stop.finished)} of {stop.total} tasks; the finished "
              f"ones are in {args.out}/partial-results.json", file=sys.stderr)
        return 130
    except KeyboardInterrupt:  # before the tasks began
        print("\nflare sim report: interrupted", file=sys.stderr)
        return 130
    print(f"wrote {path} in {time.perf_counter() - t0:.0f} s")
    return 0


def _profile_cost_model(args: argparse.Namespace) -> str:
    """The cost-model name of `--profile DIR` with its model shape (helios.sim.profile_shape); prints
    the shape it uses, and with --profile-repair the repairs made. ConfigError for a bad shape, a TP
    degree the MLP file lacks, or (without --profile-repair) a bad cell named by file, line and column."""
    from helios.sim import profile_shape
    from helios.sim.costmodel import VidurCostModel
    from helios.sim.experiment import REPAIRED

    shape, source = profile_shape.read_shape(args.profile, layers=args.profile_layers, tp=args.profile_tp,
                                             overhead_ms=args.profile_overhead_ms, comm_us=args.profile_comm_us)
    repairs: list | None = [] if args.profile_repair else None
    model = VidurCostModel.from_profile_dir(args.profile, layers=shape.layers, overhead_ms=shape.overhead_ms,
                                            comm_us_per_token_layer=shape.comm_us, tp=shape.tp, repairs=repairs)
    print(f"flare sim report: {profile_shape.describe(args.profile, shape, model.profile.tp, source)}",
          file=sys.stderr, flush=True)
    if repairs:
        print(f"flare sim report: repaired {len(repairs)} profile cells:", file=sys.stderr)
        for repair in repairs[:20]:
            print(f"  {repair}", file=sys.stderr)
        if len(repairs) > 20:
            print(f"  ... and {len(repairs) - 20} more", file=sys.stderr)
    name = profile_shape.encode(args.profile, shape)
    return REPAIRED + name if args.profile_repair else name


def _sim_mix_report(args: argparse.Namespace, setup) -> int:
    """`flare sim report --workload NAME|PATH`: the multi-SLO report (helios.sim.multislo_report)."""
    import shlex
    import time
    from dataclasses import replace

    from helios.errors import ConfigError
    from helios.sim.multislo import workload_named
    from helios.sim.multislo_report import MixReportConfig, run_mix_report

    try:
        workload = workload_named(args.workload)
    except ConfigError as exc:
        print(f"flare sim report: {exc}", file=sys.stderr)
        return 2
    cfg = MixReportConfig(workload, name=args.workload, setup=setup)
    given = {"schedulers": args.schedulers, "seeds": args.seeds, "loads": args.loads, "sweep": args.sweep,
             "refine": args.refine, "resolution": args.resolution, "jobs": args.jobs}
    cfg = replace(cfg, **{k: tuple(v) if isinstance(v, list) else v for k, v in given.items() if v})
    t0 = time.perf_counter()
    try:
        path = run_mix_report(cfg, args.out, command="flare " + shlex.join(args.argv))
    except (ConfigError, FileNotFoundError) as exc:
        print(f"flare sim report: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {path} in {time.perf_counter() - t0:.0f} s")
    return 0


def _csv(kind):
    def parse(text: str):
        try:
            return [kind(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {text!r}") from None
    return parse


def _names(text: str) -> list[str]:
    """Comma-separated names, where a variant's own list stays whole:
    "sarathi,helios-balanced[stall_pricing=0,adaptation_ms=100]" is two names."""
    names, depth, current = [], 0, ""
    for ch in text:
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            names.append(current)
            current = ""
        else:
            current += ch
    names.append(current)
    if depth != 0:
        raise argparse.ArgumentTypeError(f"unbalanced brackets in {text!r}")
    return [n.strip() for n in names if n.strip()]


def _bench(args: argparse.Namespace) -> int:
    from helios.sim.overhead import print_overhead

    print_overhead(args.iterations)
    return 0


def _run(args: argparse.Namespace) -> int:
    from helios.server.command import run

    try:
        return run(args)
    except KeyboardInterrupt:  # Ctrl-C while loading or warming up: nothing to drain yet
        print("\nflare: interrupted during startup", file=sys.stderr)
        return 130


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="flare", description="Helios LLM-serving runtime")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="serve an OpenAI-compatible API")
    from helios.server.command import add_arguments as add_run_arguments, nonnegative_float, positive_int

    add_run_arguments(run)
    run.set_defaults(func=_run)
    sim = sub.add_parser("sim", help="simulate the scheduler on a virtual clock", formatter_class=DefaultsHelp)
    sim.add_argument("--demo", action="store_true", help="a short SimCore run with a per-step trace")
    sim.add_argument("--requests", type=positive_int, default=8, help="--demo: requests to simulate")
    sim.add_argument("--steps", type=positive_int, default=40, help="--demo: scheduler steps to trace")
    sim.add_argument("--seed", type=int, default=0, help="--demo: the random seed")
    sim.add_argument("--mixed-prefill", action="store_true", help="--demo with the mixed prefill+decode catalog")
    sim.add_argument("--mixed-prompt-rows", type=positive_int, default=1, metavar="R",
                     help="--demo --mixed-prefill: prompt rows sharing a mixed graph's prompt capacity")
    sim.set_defaults(func=_sim)
    sim_sub = sim.add_subparsers(dest="sim_command")
    report = sim_sub.add_parser("report", help="run Helios and the baselines on real traces; write a report",
                                formatter_class=DefaultsHelp)
    report.add_argument("--out", default="sim-report", help="output directory (report.md, PNGs, results.json)")
    report.add_argument("--traces", type=_csv(str), help="comma-separated: azure, mooncake, multi")
    report.add_argument("--schedulers", type=_names,
                        help="comma-separated: helios-balanced, helios-throughput, helios-spec, vllm-fcfs, sarathi, vtc, direct")
    report.add_argument("--window-s", type=float, help="seconds of each trace to replay (default: enough for --min-requests)")
    report.add_argument("--loads", type=_csv(float), help="nominal loads, e.g. 0.2,0.4,0.6")
    report.add_argument("--seeds", type=_csv(int), help="comma-separated seeds (default 0,1,2): mean and range")
    report.add_argument("--min-requests", type=positive_int,
                        help="each trace's window holds at least this many requests (default 1000)")
    report.add_argument("--sweep", type=_csv(float), help="goodput sweep loads (default 0.2,0.4,0.6,0.8,1,1.4,2)")
    report.add_argument("--refine", type=positive_int, help="most goodput bisection steps (default 8)")
    report.add_argument("--resolution", type=float, help="goodput bisection resolution (default 0.05: 5%%)")
    report.add_argument("--ablation", type=_names,
                        help="Helios variants for the ablation table, e.g. 'helios-balanced[stall_pricing=0]'")
    report.add_argument("--workload", metavar="NAME|PATH",
                        help="a multi-SLO mix: 'shared' or a TOML/JSON file of streams, classes and SLOs "
                             "(docs/simulator.md); --loads are then scales of its rates")
    report.add_argument("--trace", action="append", metavar="PATH",
                        help="a trace file (Azure CSV or Mooncake JSONL; repeatable), run with the --traces")
    report.add_argument("--trace-format", choices=("azure", "mooncake"),
                        help="the format of the --trace files (default: detected from the file)")
    report.add_argument("--profile", metavar="DIR",
                        help="a directory with Vidur-format attention.csv and mlp.csv (instead of --cost-model)")
    report.add_argument("--profile-repair", action="store_true",
                        help="drop --profile rows with empty or non-numeric timings and smooth timings that fall "
                             "as tokens grow, and report each repair (default: such a cell is an error)")
    report.add_argument("--profile-layers", type=positive_int, metavar="N",
                        help="with --profile: the model's layer count (else DIR/model.json's, else 80)")
    report.add_argument("--profile-tp", type=positive_int, metavar="N",
                        help="with --profile: the tensor parallelism whose MLP rows to use (else DIR/model.json's, "
                             "else the smallest in mlp.csv)")
    report.add_argument("--profile-overhead-ms", type=nonnegative_float, metavar="MS",
                        help="with --profile: the per-graph overhead (else DIR/model.json's, else 0)")
    report.add_argument("--profile-comm-us", type=nonnegative_float, metavar="US",
                        help="with --profile: TP communication per token and layer (else DIR/model.json's, else 0)")
    report.add_argument("--cost-model", default="h100-70b",
                        help="h100-70b, a100-70b-tp2 (a 70B estimate), a100-34b-tp2, h100-7b or realistic-small")
    report.add_argument("--jobs", type=positive_int,
                        help="worker processes (default: 2, or 1 on a 1-CPU machine); results do not change")
    report.add_argument("--quick", action="store_true", help="a tiny smoke configuration")
    report.add_argument("--prefix-reuse", action="store_true",
                        help="also run every scheduler with automatic prefix reuse on the traces with block "
                             "hashes (Mooncake) and add the prefix-reuse table")
    report.add_argument("--mixed-prefill", action="store_true",
                        help="give the Helios schedulers the mixed prefill+decode catalog (baselines keep their own)")
    report.add_argument("--mixed-prompt-steps", type=positive_int, metavar="N",
                        help="with --mixed-prefill: prompt buckets per factor of four in the mixed catalog "
                             "(default 12, 26 buckets up to 4096; 3 is the spec's worked example)")
    report.add_argument("--mixed-prompt-capacity", type=positive_int, metavar="TOKENS",
                        help="with --mixed-prefill: the largest prompt chunk of a mixed graph, a multiple of 64 "
                             "(default 1600; longer chunks run in the prefill graphs)")
    report.add_argument("--mixed-prompt-rows", type=positive_int, metavar="R",
                        help="with --mixed-prefill: rows of a mixed graph that may share its prompt capacity "
                             "as one packed budget (default 1, the spec's one prompt row; "
                             "docs/packed-prompt-rows.md); a Helios scheduler's [mixed_prompt_rows=N] variant "
                             "overrides it for that row")
    report.add_argument("--prefill-capacity", type=positive_int, metavar="TOKENS",
                        help="the most prompt tokens one prefill graph of the engine takes (B x C): 64, 128, "
                             "..., 4096 (default 2048); the load and SLOs stay those of the full catalog")
    from helios.sim.explain_cli import add_parsers as add_explain_parsers

    add_explain_parsers(sim_sub)  # `flare sim run` (a run with its decision log) and `flare sim explain`
    bench = sub.add_parser("bench", help="measure the scheduler's cost per decision", formatter_class=DefaultsHelp)
    bench.add_argument("--iterations", type=positive_int, default=300, help="scheduler decisions to time")
    bench.set_defaults(func=_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.argv = argv  # the report records the command that made it
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())

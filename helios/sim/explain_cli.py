"""`flare sim run` and `flare sim explain`: their flags and commands (helios.cli adds them)."""

from __future__ import annotations

import argparse
import sys


def add_parsers(sim_sub) -> None:
    run = sim_sub.add_parser("run", help="simulate one trace window and write its decision log (for `flare sim explain`)")
    run.add_argument("--out", default="sim-run", help="the RUN directory (run.json, requests.jsonl, decisions.jsonl)")
    run.add_argument("--trace", default="azure", help="azure, mooncake or multi (default azure)")
    run.add_argument("--load", type=float, default=0.8, help="nominal load (default 0.8; see `flare sim report`)")
    run.add_argument("--window-s", type=float, default=20.0, help="seconds of the trace to replay (default 20)")
    run.add_argument("--scheduler", default="helios-balanced", help="a `flare sim report` scheduler name")
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--cost-model", default="h100-70b", help="as `flare sim report --cost-model`")
    explain = sim_sub.add_parser("explain", help="why a request waited, from a `flare sim run` directory")
    explain.add_argument("run", metavar="RUN", help="a directory written by `flare sim run`")
    explain.add_argument("--request", type=int, metavar="ID", help="the request (its handle, as in requests.jsonl)")
    explain.add_argument("--at", type=float, metavar="T", help="virtual seconds: the decision in force at T, or "
                         "with --request the wait of that request that contains T")


def run_command(args: argparse.Namespace) -> int:
    from helios.errors import ConfigError

    if args.sim_command == "explain":
        from helios.sim.explain import explain

        try:
            print(explain(args.run, args.request, args.at))
        except (FileNotFoundError, KeyError) as exc:
            print(f"flare sim explain: {exc}", file=sys.stderr)
            return 2
        return 0
    from helios.sim.decision_run import run_and_write
    from helios.sim.experiment import setup_from_flags

    try:
        out = run_and_write(args.out, scheduler=args.scheduler, trace=args.trace, load=args.load,
                            window_s=args.window_s, seed=args.seed, setup=setup_from_flags(cost_model=args.cost_model))
    except (ConfigError, FileNotFoundError, ValueError) as exc:
        print(f"flare sim run: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {out} (explain a request: flare sim explain {out} --request ID)")
    return 0

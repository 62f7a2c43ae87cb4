"""`flare`: run (serve), sim (simulate) and bench (scheduler overhead)."""

from __future__ import annotations

import argparse
import sys


def _sim(args: argparse.Namespace) -> int:
    from helios.sim.demo import run_demo

    if not args.demo:
        print("flare sim: choose --demo (trace-driven runs arrive with `flare sim report`)", file=sys.stderr)
        return 2
    run_demo(requests=args.requests, seed=args.seed, steps=args.steps)
    return 0


def _bench(args: argparse.Namespace) -> int:
    from helios.sim.overhead import print_overhead

    print_overhead(args.iterations)
    return 0


def _run(args: argparse.Namespace) -> int:
    print("flare run: the HTTP server is not available yet; try `flare sim --demo`", file=sys.stderr)
    return 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="flare", description="Helios LLM-serving runtime")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="serve an OpenAI-compatible API")
    run.set_defaults(func=_run)
    sim = sub.add_parser("sim", help="simulate the scheduler on a virtual clock")
    sim.add_argument("--demo", action="store_true", help="a short SimCore run with a per-step trace")
    sim.add_argument("--requests", type=_positive, default=8)
    sim.add_argument("--steps", type=_positive, default=40)
    sim.add_argument("--seed", type=int, default=0)
    sim.set_defaults(func=_sim)
    bench = sub.add_parser("bench", help="measure the scheduler's cost per decision")
    bench.add_argument("--iterations", type=_positive, default=300)
    bench.set_defaults(func=_bench)
    return parser


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())

"""Scheduler cost per decision (plan + commit + complete + publish) at 1, 4, 16 and 64 active
requests on a catalog of over 100 graphs, printed as a ratio to the catalog's shortest decode
graph, then the split of the decision between plan, commit, complete and publish at 64.
Run: PYTHONPATH=. .venv/bin/python bench/plan_overhead.py [iterations] [--classes]
(--classes: the streams cycle through the built-in interactive, standard and batch service classes)."""

import sys

from helios.sim.overhead import print_overhead

if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--classes"]
    print_overhead(int(args[0]) if args else 300, classes="--classes" in sys.argv[1:])

"""Scheduler cost per decision (plan + commit + complete + publish) at 1, 4, 16 and 64 active
requests on a catalog of over 100 graphs, printed as a ratio to the catalog's shortest decode
graph, then the split of the decision between plan, commit, complete and publish at 64.
Run: PYTHONPATH=. .venv/bin/python bench/plan_overhead.py [iterations]"""

import sys

from helios.sim.overhead import print_overhead

if __name__ == "__main__":
    print_overhead(int(sys.argv[1]) if len(sys.argv) > 1 else 300)

"""Per-decision cost (plan + commit + complete + publish) at 64 active, as the median and 10th
percentile of single decisions, which a machine shared with other jobs skews far less than
bench/plan_overhead.py's mean. The balanced preset on the overhead catalog, with the step harness
of helios.sim.overhead. Compare two trees by running it alternately with each on PYTHONPATH:

    for i in 1 2 3; do for d in OLD NEW; do PYTHONPATH=$d python bench/decision_cost.py; done; done
"""

import statistics
import sys

from helios.sim.overhead import cost_models, decision_parts, shortest_decode_ns

if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 900
    for name, model in cost_models().items():
        times = sorted(sum(p.values()) * 1e6 for p in decision_parts(64, n, model))
        shortest = shortest_decode_ns(model) / 1e3
        med = statistics.median(times)
        print(f"{name}: median {med:.1f} us ({med / shortest:.2%} of the shortest decode graph), "
              f"p10 {times[len(times) // 10]:.1f} us, over {n} decisions at 64 active")

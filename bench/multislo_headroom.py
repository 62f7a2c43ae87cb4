"""How much a multi-SLO mix's goodput can gain from trading its classes (issue 40).

    PYTHONPATH=. python bench/multislo_headroom.py [--workload shared] [--schedulers helios-balanced,edf]
        [--seeds 0,1,2] [--mixed-prefill] [--jobs 2]

For each scheduler and seed it bisects (as `flare sim report --workload` does) the multi-SLO goodput of
the mix, and of the same mix without its deadline-only classes (`multislo.without_deadline_only`: the
batch streams removed, every other request the same). The second is what the classes with first-token
and gap targets allow by themselves: a scheduler that orders the batch work perfectly around them can
lift the mix's goodput scale about that far, and no further, by trading classes. Goodput is printed as
the scale of the mix's rates (1.0: the workload's rates), so the two columns compare directly, with
their ratio taken in this run.
"""

from __future__ import annotations

import argparse
import sys
from concurrent.futures import ProcessPoolExecutor

from helios.cli import _names
from helios.sim.experiment import setup_from_flags
from helios.sim.multislo import deadline_only, without_deadline_only, workload_named
from helios.sim.multislo_report import MixReportConfig, run_task


def goodput_scale(scheduler: str, seed: int, workload_name: str, trimmed: bool, mixed: bool) -> float:
    workload = workload_named(workload_name)
    if trimmed:
        workload = without_deadline_only(workload)
    # The report's sweep and bisection, without its common-load runs.
    cfg = MixReportConfig(workload, setup=setup_from_flags(mixed_prefill=mixed), loads=())
    return run_task(scheduler, seed, cfg)["goodput_scale"] or 0.0  # None: even the lowest scale failed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="shared", help="'shared' or a workload file")
    ap.add_argument("--schedulers", type=_names, default=["helios-balanced", "edf"])
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--mixed-prefill", action="store_true", help="Helios gets the mixed catalog (as the report)")
    ap.add_argument("--jobs", type=int, default=2)
    a = ap.parse_args()
    seeds = [int(s) for s in a.seeds.split(",")]
    dropped = sorted(deadline_only(workload_named(a.workload)))
    jobs = [(s, seed, a.workload, trimmed, a.mixed_prefill) for s in a.schedulers for seed in seeds
            for trimmed in (False, True)]
    with ProcessPoolExecutor(a.jobs) as pool:
        scales = list(pool.map(goodput_scale, *zip(*jobs)))
    got = {(j[0], j[1], j[3]): v for j, v in zip(jobs, scales)}
    print(f"goodput as a scale of the mix's rates; 'without' drops the deadline-only classes: {', '.join(dropped) or 'none'}")
    print("| scheduler | seed | whole mix | without | without / whole |")
    print("|---|---:|---:|---:|---:|")
    for s in a.schedulers:
        for seed in seeds:
            whole, without = got[(s, seed, False)], got[(s, seed, True)]
            ratio = f"{without / whole:.2f}x" if whole else "n/a"
            print(f"| {s} | {seed} | {whole:.3f} | {without:.3f} | {ratio} |")
        whole = sum(got[(s, seed, False)] for seed in seeds) / len(seeds)
        without = sum(got[(s, seed, True)] for seed in seeds) / len(seeds)
        ratio = f"{without / whole:.2f}x" if whole else "n/a"
        print(f"| {s} | mean | {whole:.3f} | {without:.3f} | {ratio} |")
    sys.stdout.flush()


if __name__ == "__main__":
    main()

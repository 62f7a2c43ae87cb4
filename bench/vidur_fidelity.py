"""Fidelity of the vllm-fcfs and sarathi baselines against Vidur 0.0.26 on the same requests and profile.

Both simulators replay the same Azure 2023 conversation requests (the first `--requests`, arrivals
divided by `--rate-scale`) on the same A100 profile: the matched Vidur attention+MLP CSVs in data/
(CodeLlama-34B, 48 layers, TP2). Printed: our TTFT p50/p90/p99, TBT p50/p99 and E2E p50/p99 over
Vidur's, for each baseline, in one run.

    PYTHONPATH=. python bench/vidur_fidelity.py --vidur-python /work/vidur-venv/bin/python --work-dir /tmp/vf

PYTHONPATH picks the Helios code under test (a checkout of an older commit gives "before" figures;
the script adapts to baselines without packed forwards). Vidur's results are kept in --work-dir and
reused while the job (requests, profile, comm term) is unchanged.

Vidur runs in its own virtual environment (`pip install torch==2.13.0 vidur==0.0.26`, a CPU torch);
this script calls it in a subprocess (`--vidur-side`). Vidur fetches its profiles from a hub at run
time; here it runs offline (HF_HUB_OFFLINE=1) on a hub cache laid out from our own CSVs:
- compute: our mlp.csv and attention.csv as they are (xz-compressed), under the dataset name
  `helios/a100-codellama-34b-tp2`;
- network: Vidur's all-reduce profile is not in data/, so all_reduce.csv is generated from our
  cost model's comm term (one all-reduce of n tokens = comm x n / 2, two per layer), and both
  sides add the same per-forward fixed cost (Vidur's NCCL launch overhead, 0.02 ms per
  all-reduce), which replaces our Splitwise-fitted per-forward overhead: Vidur 0.0.26 models no
  LM head, sampler or CPU overhead.
Vidur's `random_forrest` predictor trains on these files with one hyperparameter set (the grid
search over 27 sets x 10 folds takes too long on two cores), and its plots are off.

Same requests (prompts cut so that prompt + output <= 4096, Vidur's trace-replay rule, inside the
profiled range) and scheduler settings on both sides: sarathi chunk 512; vLLM's token budget 4096
(Vidur's `max_tokens_in_batch`); at most 64 running requests. Vidur's vLLM is the V0 scheduler
(whole prompts, prefill first, no chunking); ours is V1-style (chunked prefill, decodes first):
its ratios measure that difference too, not only the pricing.
"""

from __future__ import annotations

import argparse
import csv
import json
import lzma
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

MODEL = "codellama/CodeLlama-34b-Instruct-hf"
COMPUTE_DATASET = "helios/a100-codellama-34b-tp2"
LAYERS = 48
MAX_TOKENS = 4096  # prompt + output, as profiled
HIDDEN = 8192
NCCL_LAUNCH_MS = 0.02  # Vidur's default nccl_cpu_launch_overhead_ms, paid per all-reduce
BASELINES = {"sarathi": {"chunk_size": 512}, "vllm-fcfs": {"token_budget": 4096}}
METRICS = (("ttft", 50), ("ttft", 90), ("ttft", 99), ("tbt", 50), ("tbt", 99), ("e2e", 50), ("e2e", 99))


# ---- our side (project venv) ------------------------------------------------------------------------

def azure_requests(n: int, rate_scale: float):
    from helios.sim.traces import load_azure_conv

    reqs = load_azure_conv(duration_s=3600, max_context=8192)[:n]
    # Vidur's trace replay cuts prompts so that prompt + output <= max_tokens; it is done here, for both
    # sides, at the profiles' 4096 tokens (beyond them Vidur's random forests predict flat).
    return [(r.arrival_ns / rate_scale / 1e9, min(r.prompt_tokens, MAX_TOKENS - r.output_tokens), r.output_tokens)
            for r in reqs]


def our_cost_model(comm_us: float | None):
    """The A100 CodeLlama-34B profile with the terms Vidur can express (see the module docstring).

    comm_us: all-reduce cost per token and layer; None takes the a100-34b-tp2 profile's (borrowed) term,
    which commits older than that profile lack: give it explicitly there."""
    from helios.sim.costmodel import PROFILES, VidurCostModel

    if "a100-34b-tp2" in PROFILES:
        base = VidurCostModel.from_data("a100-34b-tp2")
    elif comm_us is None:
        raise SystemExit("this Helios has no a100-34b-tp2 profile: pass --comm-us")
    else:  # older commits: the same CSVs under the old name, unscaled, with 80 layers
        base = VidurCostModel.from_data("a100-70b-tp2", overhead_ms=0.0, comm_us_per_token_layer=comm_us)
    comm = base.comm_ms_per_token_layer if comm_us is None else comm_us / 1000
    profile = base.profile if base.profile.layers == LAYERS else _replace(base.profile, layers=LAYERS)
    return VidurCostModel(profile, base.linear, base.decode, base.prefill,
                          overhead_ms=2 * LAYERS * NCCL_LAUNCH_MS, comm_ms_per_token_layer=comm)


def _replace(profile, **changes):
    from dataclasses import replace
    return replace(profile, **changes)


def run_ours(name: str, requests, model) -> dict[str, np.ndarray]:
    import inspect

    from helios.baselines import SCHEDULERS, make_scheduler
    from helios.engine.sim_core import SimCore
    from helios.scheduler import RequestSpec
    from helios.sim.experiment import Setup, warm_up
    from helios.sim.loop import Arrival, Simulation

    setup = Setup(cost_model="a100-34b-tp2", noise=0.0)
    catalog, config = setup.catalog(), setup.config()
    options = dict(BASELINES[name])
    if "packed" in inspect.signature(SCHEDULERS[name].__init__).parameters:
        options["packed"] = True
    sched = make_scheduler(name, catalog, None, config, **options)
    warm_up(sched, catalog, model, setup.warmup_context)
    sim = Simulation(sched, SimCore(catalog, model, seed=0))
    sim.add([Arrival(int(t * 1e9), RequestSpec(p, o), output_len=o) for t, p, o in requests])
    sim.run()
    ttft, e2e, tbt = [], [], []
    for log in sim.logs.values():
        times = [t for t, _ in log.publications]
        ttft.append(times[0] - log.arrival_ns)
        e2e.append(log.finished_ns - log.arrival_ns)
        tbt += list(np.diff(times))
    return {k: np.asarray(v, dtype=float) / 1e6 for k, v in (("ttft", ttft), ("tbt", tbt), ("e2e", e2e))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vidur-python", help="python of the venv where vidur 0.0.26 is installed")
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--rate-scale", type=float, default=0.25, help="arrival rate / the trace's own rate")
    ap.add_argument("--comm-us", type=float, default=None, help="all-reduce us per token and layer "
                    "(default: the a100-34b-tp2 profile's)")
    ap.add_argument("--work-dir", default=None, help="hub cache and Vidur output (default: a temp dir)")
    ap.add_argument("--vidur-side", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--input", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.vidur_side:
        return vidur_side(Path(args.work_dir), json.loads(Path(args.input).read_text()), args.vidur_side)
    if not args.vidur_python:
        ap.error("--vidur-python is required")
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="vidur-fidelity-"))
    work.mkdir(parents=True, exist_ok=True)
    requests = azure_requests(args.requests, args.rate_scale)
    model = our_cost_model(args.comm_us)
    job = {"requests": requests, "comm_ms_per_token_layer": model.comm_ms_per_token_layer,
           "data_dir": str(Path(__file__).resolve().parents[1] / "data"), "baselines": BASELINES}
    job_file = work / "job.json"
    same_job = job_file.exists() and json.loads(job_file.read_text()) == json.loads(json.dumps(job))
    job_file.write_text(json.dumps(job))
    theirs = {}
    for name in BASELINES:
        done = work / f"vidur_{name}.json"
        if not (same_job and done.exists()):
            # One process per simulation: Vidur numbers its replicas process-wide.
            env = dict(os.environ, HF_HUB_OFFLINE="1", WANDB_MODE="disabled")
            subprocess.run([args.vidur_python, str(Path(__file__).resolve()), "--vidur-side", name, "--work-dir",
                            str(work), "--input", str(job_file)], check=True, env=env, cwd=work)
        theirs[name] = json.loads(done.read_text())
    print(f"{len(requests)} Azure conv requests at rate scale {args.rate_scale} "
          f"({len(requests) / requests[-1][0]:.2f} req/s), comm {model.comm_ms_per_token_layer * 1e3:.4f} us per "
          f"token and layer, {model.overhead_ms:.2f} ms per forward; ours / Vidur 0.0.26")
    print("| baseline | " + " | ".join(f"{m.upper()} p{q}" for m, q in METRICS) + " |")
    print("|---|" + "---:|" * len(METRICS))
    for name in BASELINES:
        ours = run_ours(name, requests, model)
        cells = []
        for m, q in METRICS:
            a, b = float(np.percentile(ours[m], q)), theirs[name][f"{m}_p{q}"]
            cells.append(f"{a / b:.2f} ({a:.0f}/{b:.0f})")
        print(f"| {name} | " + " | ".join(cells) + " |")
    print("(cells: ratio (ours ms / Vidur ms))")


# ---- Vidur side (vidur venv, a subprocess) -----------------------------------------------------------

def network_dataset(comm_ms_per_token_layer: float) -> str:
    # Vidur caches trained models by dataset name, not content: a name per comm term keeps them apart.
    return f"helios/a100-pairwise-nvlink-comm-{comm_ms_per_token_layer * 1e6:.0f}ps"


def lay_hub_cache(cache: Path, data_dir: Path, comm_ms_per_token_layer: float) -> None:
    """An offline huggingface_hub cache holding the compute and network datasets Vidur downloads."""
    def dataset(root: Path, repo: str, config: dict, files: dict[str, bytes]) -> None:
        base = root / f"datasets--{repo.replace('/', '--')}"
        snap = base / "snapshots" / ("0" * 40)
        snap.mkdir(parents=True, exist_ok=True)
        (base / "refs").mkdir(exist_ok=True)
        (base / "refs" / "main").write_text("0" * 40)
        (snap / "config.json").write_text(json.dumps(config))
        for name, body in files.items():
            (snap / name).write_bytes(lzma.compress(body))

    dataset(cache / "profiling_data" / "compute", COMPUTE_DATASET, {"model": MODEL, "device_sku": "a100"},
            {"mlp.csv.xz": (data_dir / "vidur_a100_llama2-70b-shape_tp2_mlp.csv").read_bytes(),
             "attention.csv.xz": (data_dir / "vidur_a100_llama2-70b-shape_tp2_attention.csv").read_bytes()})
    rows = ["size,num_workers,devices_per_node,collective,time_stats.all_reduce.median,time_stats.send_recv.median"]
    for tokens in [1, 2, 4] + list(range(8, 8193, 8)):
        ms = comm_ms_per_token_layer * tokens / 2  # two all-reduces per layer
        rows.append(f"{tokens * HIDDEN * 2},2,2,all_reduce,{ms},")
        rows.append(f"{tokens * HIDDEN * 2},2,2,send_recv,,{ms}")
    body = ("\n".join(rows) + "\n").encode()
    dataset(cache / "profiling_data" / "network", network_dataset(comm_ms_per_token_layer), {"sku": "a100_pairwise_nvlink"},
            {"all_reduce.csv.xz": body, "send_recv.csv.xz": body})


def vidur_side(work: Path, job: dict, name: str) -> None:
    from vidur import config as vc
    from vidur.metrics.constants import RequestMetricsTimeDistributions as R
    from vidur.metrics.constants import TokenMetricsTimeDistribution as T
    from vidur.simulator import Simulator

    cache = work / "vidur_cache"
    lay_hub_cache(cache, Path(job["data_dir"]), job["comm_ms_per_token_layer"])
    trace = work / "trace.csv"
    with open(trace, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["Date", "Time", "PromptTokenCount", "CompletionTokenCount"])
        for t, p, o in job["requests"]:
            w.writerow(["2023-11-16", t, p, o])
    if name == "sarathi":
        sched = vc.SarathiSchedulerConfig(chunk_size=job["baselines"][name]["chunk_size"], batch_size_cap=64)
    else:
        sched = vc.VllmSchedulerConfig(max_tokens_in_batch=job["baselines"][name]["token_budget"],
                                       batch_size_cap=64)
    output = work / f"vidur_{name}"
    output.mkdir(exist_ok=True)
    config = vc.SimulationConfig(
        seed=0,
        cluster_config=vc.ClusterConfig(
            num_replicas=1,
            replica_config=vc.ReplicaConfig(model_name=MODEL, num_pipeline_stages=1, tensor_parallel_size=2,
                                            device="a100", network_device="a100_pairwise_nvlink"),
            replica_scheduler_config=sched),
        request_generator_config=vc.TraceRequestGeneratorConfig(
            trace_file=str(trace), date="2023-11-16", prefill_scale_factor=1, decode_scale_factor=1,
            time_scale_factor=1, max_tokens=MAX_TOKENS),
        execution_time_predictor_config=vc.RandomForrestExecutionTimePredictorConfig(
            model_profiling_dataset=COMPUTE_DATASET, network_profiling_dataset=network_dataset(job["comm_ms_per_token_layer"]),
            num_estimators=[250], max_depth=[32], min_samples_split=[2], k_fold_cv_splits=2,
            prediction_max_tokens_per_request=8192, cache_dir=str(cache)),
        metrics_config=vc.MetricsConfig(store_plots=False, enable_chrome_trace=False,
                                        store_token_completion_metrics=True, store_utilization_metrics=False,
                                        output_dir=str(output)))
    sim = Simulator(config)
    sim.run()
    store = sim._metric_store
    series = store._request_metrics_time_distributions
    ttft = np.array([y for _, y in series[R.PREFILL_TIME_E2E]._data_series]) * 1e3
    e2e = np.array([y for _, y in series[R.REQUEST_E2E_TIME]._data_series]) * 1e3
    sketch = store._token_metrics_time_distribution[T.DECODE_TOKEN_EXECUTION_PLUS_PREMPTION_TIME]._sketch
    out = {f"ttft_p{q}": float(np.percentile(ttft, q)) for q in (50, 90, 99)}
    out.update({f"e2e_p{q}": float(np.percentile(e2e, q)) for q in (50, 99)})
    out.update({f"tbt_p{q}": float(sketch.get_quantile_value(q / 100)) * 1e3 for q in (50, 99)})
    out["requests"] = len(ttft)
    (work / f"vidur_{name}.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

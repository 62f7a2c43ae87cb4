"""Issue 43: `flare sim report` a user can watch and stop. The plan comes first, a line per finished
task with elapsed time and ETA (no terminal needed), Ctrl-C stops the workers and keeps the
finished tasks; `--profile` takes the model shape from flags or DIR/model.json and prints it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from helios.cli import main
from helios.errors import ConfigError
from helios.sim import profile_shape
from helios.sim.costmodel import VidurCostModel
from test_user_data import _profile  # tests/sim is on sys.path (pytest prepend import mode)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _descendants(pid: int) -> set[int]:
    found, todo = set(), [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/task/{p}/children") as fh:
                kids = {int(x) for x in fh.read().split()}
        except OSError:
            continue
        found |= kids
        todo += kids
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_stops_the_workers_within_5_s_and_keeps_finished_tasks(tmp_path, sig):
    """Rule: the plan prints before any run; SIGINT (or SIGTERM) cancels pending tasks, the worker
    processes are gone within 5 s, the exit is quiet (no traceback) with status 130."""
    out = tmp_path / "r"
    proc = subprocess.Popen([sys.executable, "-m", "helios.cli", "sim", "report", "--quick", "--jobs", "2",
                             "--traces", "mooncake", "--out", str(out)], cwd=ROOT, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    plan = proc.stderr.readline()
    assert plan.startswith("flare sim report: plan: 7 tasks") and "of CPU" in plan, plan
    deadline = time.monotonic() + 60
    workers: set[int] = set()
    while len(workers) < 2 and time.monotonic() < deadline:  # both workers running a task
        workers = _descendants(proc.pid)
        time.sleep(0.05)
    assert len(workers) >= 2
    proc.send_signal(sig)
    stopped = time.monotonic()
    rest = proc.stderr.read()
    assert proc.wait(30) == 130
    while any(_alive(w) for w in workers) and time.monotonic() - stopped < 5:
        time.sleep(0.05)
    assert not any(_alive(w) for w in workers), "workers outlived the report by 5 s"
    assert "Traceback" not in rest and "interrupted after" in rest, rest
    partial = json.loads((out / "partial-results.json").read_text())
    assert isinstance(partial["finished_tasks"], list)


def test_each_finished_task_prints_a_line_with_elapsed_and_eta(tmp_path, capsys):
    assert main(["sim", "report", "--quick", "--traces", "azure", "--schedulers", "sarathi,vllm-fcfs",
                 "--jobs", "1", "--out", str(tmp_path)]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("flare sim report: plan: 2 tasks") and "--quick" not in err[0]
    lines = [line for line in err if line.startswith("flare sim report: [")]
    assert [line.split("]")[0][-3:] for line in lines] == ["1/2", "2/2"]
    assert all("elapsed" in line and "ETA" in line for line in lines)


def test_profile_shape_comes_from_flags_over_model_json_over_defaults(tmp_path):
    d = _profile(tmp_path)
    shape, source = profile_shape.read_shape(d)
    assert (shape.layers, shape.overhead_ms, source["layers"]) == (80, 0.0, "default")
    (d / "model.json").write_text('{"layers": 28, "overhead_ms": 1.5}')
    shape, source = profile_shape.read_shape(d, layers=32)
    assert (shape.layers, shape.overhead_ms) == (32, 1.5)
    assert (source["layers"], source["overhead_ms"], source["tp"]) == ("flag", "model.json", "default")
    name = profile_shape.encode(d, shape)
    assert profile_shape.decode(name) == (str(d), shape)
    # The shape changes the model: 28 layers cost less than 80 for the same graph.
    from helios.graphs import GraphKind, GraphShape
    from helios.sim.experiment import load_cost_model
    g = GraphShape(GraphKind.DECODE, 8)
    assert load_cost_model(profile_shape.encode(d, profile_shape.ProfileShape(28))).duration_ns(g, [512] * 8) < \
        load_cost_model(profile_shape.encode(d, profile_shape.ProfileShape(80))).duration_ns(g, [512] * 8)
    (d / "model.json").write_text('{"layers": 0}')
    with pytest.raises(ConfigError, match="layers must be a positive integer"):
        profile_shape.read_shape(d)
    (d / "model.json").write_text('{"layer": 28}')
    with pytest.raises(ConfigError, match="unknown key"):
        profile_shape.read_shape(d)
    with pytest.raises(ConfigError, match="no rows for tensor parallelism 3"):
        VidurCostModel.from_profile_dir(d, tp=3)


def test_report_prints_and_records_the_profile_shape(tmp_path, capsys):
    d = _profile(tmp_path)
    (d / "model.json").write_text('{"layers": 28}')
    out = tmp_path / "r"
    assert main(["sim", "report", "--quick", "--profile", str(d), "--profile-overhead-ms", "2",
                 "--traces", "azure", "--schedulers", "sarathi", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "28 layers (model.json)" in err and "per-graph overhead 2 ms (flag)" in err
    assert "28 layers, tensor parallelism 1, per-graph overhead 2.00 ms" in (out / "report.md").read_text()

"""helios.engine.cpu_threads: one torch thread for every model call, and a thread count that
follows the CPUs other processes leave free; a tensor-parallel shard is built on its torch thread."""

import os
import sys
import threading

import pytest
import torch

from helios.engine.cpu_threads import CpuLoad, TorchThread, threads_for
from helios.engine.torch_core import TorchCore
from helios.graphs import GraphKind, GraphShape
from helios.server.openmp import SPIN_COUNT, choose_wait_policy

sys.path.insert(0, os.path.dirname(__file__))
from torch_helpers import chat, lane, loaded, plan  # noqa: E402,F401 (loaded is a fixture)


@pytest.mark.parametrize("cores,others,most,expected", [
    (2, 0.0, 2, 2),     # idle machine: every core
    (2, 0.2, 2, 2),     # a background tick does not cost a thread
    (2, 0.3, 2, 1),     # a steady process does
    (2, 1.0, 2, 1),     # one CPU burner
    (2, 2.0, 2, 1),     # never below one
    (2, 7.5, 2, 1),     # more busy than there are cores (steal, rounding)
    (16, 3.0, 16, 13),
    (16, 0.0, 4, 4),    # never above the cap
])
def test_threads_follow_the_cores_other_processes_leave(cores, others, most, expected):
    assert threads_for(cores, others, most) == expected


def _stat(ticks_per_cpu: dict[int, int]) -> str:
    total = sum(ticks_per_cpu.values())
    # user nice system idle iowait irq softirq steal guest guest_nice
    lines = [f"cpu  {total} 0 0 999 0 0 0 0 0 0"]
    lines += [f"cpu{i} {t // 2} 0 {t - t // 2} 500 7 0 0 0 0 0" for i, t in ticks_per_cpu.items()]
    return "\n".join(lines + ["intr 12345", "ctxt 678"]) + "\n"


def test_other_processes_cpu_is_the_busy_time_of_our_cpus_less_our_own(tmp_path):
    path = tmp_path / "stat"
    path.write_text(_stat({0: 1000, 1: 1000, 2: 1000}))
    clock, own = [10.0], [3.0]
    load = CpuLoad(str(path), cpus=[0, 1], clock=lambda: clock[0], own=lambda: own[0])
    load.ticks = 100
    # In 2 s: cpu0 and cpu1 busy for 300 ticks (3 s) in all, 1 s of it ours; cpu2 is not ours.
    path.write_text(_stat({0: 1200, 1: 1100, 2: 9000}))
    clock[0], own[0] = 12.0, 4.0
    assert load.available and load.cores == 2
    assert load.others() == pytest.approx((3.0 - 1.0) / 2.0)
    # Only our own work since: nobody else.
    path.write_text(_stat({0: 1300, 1: 1100, 2: 9000}))
    clock[0], own[0] = 13.0, 5.0
    assert load.others() == pytest.approx(0.0)


def test_an_unreadable_or_foreign_stat_file_turns_the_governor_off(tmp_path):
    assert not CpuLoad(str(tmp_path / "missing")).available
    path = tmp_path / "stat"
    path.write_text("cpu0 not numbers\n")
    assert CpuLoad(str(path)).others() is None


def test_every_call_runs_on_the_same_thread_whoever_calls():
    worker = TorchThread(threads=1)
    seen = []

    def caller():
        seen.append(worker.call(threading.get_ident))

    callers = [threading.Thread(target=caller) for _ in range(3)]
    for t in callers:
        t.start()
    for t in callers:
        t.join()
    seen.append(worker.call(threading.get_ident))
    assert len(set(seen)) == 1 and seen[0] != threading.get_ident()
    # A call made on the torch thread runs in place (no deadlock waiting for itself).
    assert worker.call(lambda: worker.call(threading.get_ident)) == seen[0]


def test_an_exception_reaches_the_caller_and_the_thread_keeps_serving():
    worker = TorchThread(threads=1)
    with pytest.raises(ZeroDivisionError):
        worker.call(lambda: 1 / 0)
    assert worker.call(lambda: 41 + 1) == 42


class _ScriptedLoad:
    available = True
    cores = 2

    def __init__(self, values):
        self.values = list(values)

    def others(self):
        return self.values.pop(0)


def test_the_thread_count_drops_while_another_process_runs_and_comes_back():
    load = _ScriptedLoad([0.0, 1.0, 1.0, 0.05])
    worker = TorchThread(interval_s=0.0, load=load)
    worker.most = 2  # as on a 2-core machine, whatever this one has
    counts = [worker.call(torch.get_num_threads) for _ in range(4)]
    assert counts == [2, 1, 1, 2]
    assert worker.threads == 2


def test_a_fixed_thread_count_is_never_governed():
    worker = TorchThread(threads=1, interval_s=0.0)
    assert worker.load is None
    assert [worker.call(torch.get_num_threads) for _ in range(3)] == [1, 1, 1]
    with pytest.raises(ValueError):
        TorchThread(threads=0)


def test_flare_asks_for_a_short_spin_before_torch_loads(monkeypatch):
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    # torch is loaded in this process: too late to choose.
    assert choose_wait_policy() is None and "GOMP_SPINCOUNT" not in os.environ
    monkeypatch.delitem(sys.modules, "torch")
    assert choose_wait_policy() == "GOMP_SPINCOUNT"
    assert os.environ["GOMP_SPINCOUNT"] == SPIN_COUNT
    # A choice in the environment is the user's.
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    monkeypatch.delenv("GOMP_SPINCOUNT")
    assert choose_wait_policy() is None and "GOMP_SPINCOUNT" not in os.environ


def test_torch_core_runs_every_graph_on_its_torch_thread(loaded):
    core = TorchCore(loaded=loaded, request_slots=1, max_batch=1, max_context=256, prefill_chunks=(64,))
    ran_on = []
    for name in ("_time_graph", "_execute"):
        inner = getattr(core, name)
        setattr(core, name, lambda *a, inner=inner: (ran_on.append(threading.get_ident()), inner(*a))[1])
    tok = loaded.tokenizer
    core.time_graph(GraphShape(GraphKind.DECODE, 1), 16)
    core.attach(1, chat(tok, "Hi"))
    prompt = len(core.requests[1].prompt)
    core.execute(plan(GraphShape(GraphKind.PREFILL, 1, 64), [lane(1, 0, 0, prompt)]), 1)
    other = threading.Thread(target=core.execute, args=(plan(GraphShape(GraphKind.DECODE, 1),
                                                             [lane(1, 0, context=prompt + 1)]), 2))
    other.start()
    other.join()
    assert len(ran_on) == 3 and set(ran_on) == {core.torch_thread.call(threading.get_ident)}
    assert threading.get_ident() not in ran_on
    assert len(core.requests[1].generated) == 2


def test_a_tensor_parallel_shard_is_built_on_the_thread_that_runs_it(monkeypatch):
    # A thread that starts an OpenMP region gets its own pool: the shard's weights are packed on
    # the torch thread its TorchCore then runs on, so a rank process keeps one pool.
    from helios.engine import sharding

    built_on = []
    load = sharding._load_shard
    monkeypatch.setattr(sharding, "_load_shard", lambda *a: (built_on.append(threading.get_ident()), load(*a))[1])
    core, _ = sharding.build_rank_core(0, 1, None, "cpu", dict(request_slots=1, max_batch=1, max_context=128,
                                                               prefill_chunks=(64,)))
    ran_on = core.torch_thread.call(threading.get_ident)
    core.time_graph(GraphShape(GraphKind.DECODE, 1), 16)
    assert built_on == [ran_on] and ran_on != threading.get_ident()

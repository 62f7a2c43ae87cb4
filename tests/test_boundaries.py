"""The scheduler boundary (DESIGN section 3): the protocol is the whole surface, and one step
loop (helios/runtime/step.py) is the only caller of its decision calls.

No module of `helios` outside `helios/scheduler/` and `helios/baselines/` (which are schedulers),
and no benchmark, reads a scheduler's request table, resources, cost table, counters or any other member that
helios.scheduler.protocol.SchedulerProtocol does not declare. The check is on the source (AST),
as the purity test is: an attribute read `X.name`, or `getattr(X, "name")`, where `name` is a
scheduler member outside the protocol and `X` is a scheduler: a name or attribute called
`scheduler`/`sched`, a name bound to a scheduler constructor or factory, or a parameter
annotated with a scheduler type.
"""

import ast
import pathlib

from helios.baselines import SCHEDULERS, make_scheduler
from helios.config import SchedulerConfig
from helios.graphs import Catalog, GraphKind, GraphShape
from helios.scheduler.protocol import SchedulerProtocol

HELIOS = pathlib.Path(__file__).resolve().parents[1] / "helios"
BENCH = HELIOS.parent / "bench"
SCHEDULER_PACKAGES = (HELIOS / "scheduler", HELIOS / "baselines")
RECEIVER_NAMES = {"scheduler", "sched"}
SCHEDULER_TYPES = {"Scheduler", "SchedulerProtocol"}


def protocol_members() -> set[str]:
    return {n for n in dir(SchedulerProtocol) if not n.startswith("__")} | {"catalog"}


def scheduler_internals() -> set[str]:
    """Every member of every scheduler that the protocol does not declare."""
    catalog = Catalog([GraphShape(GraphKind.DECODE, b) for b in (1, 2, 4)]
                      + [GraphShape(GraphKind.PREFILL, 1, 64)])
    names = set()
    for name in SCHEDULERS:
        s = make_scheduler(name, catalog, None, SchedulerConfig(request_slots=4))
        names |= {n for n in dir(s) if not n.startswith("__")}
    return names - protocol_members()


def _is_factory(call: ast.AST) -> bool:
    if not isinstance(call, ast.Call):
        return False
    f = call.func
    name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
    return name in SCHEDULER_TYPES or name.lower().endswith("scheduler")


def _annotated_scheduler(arg: ast.arg) -> bool:
    return arg.annotation is not None and any(t in ast.unparse(arg.annotation) for t in SCHEDULER_TYPES)


def violations(source: str, internals: set[str]) -> list[str]:
    """`line: expr` for every read of a member named in `internals` on a scheduler in `source`."""
    tree = ast.parse(source)
    bound = set(RECEIVER_NAMES)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and _is_factory(node.value):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            bound |= {t.id for t in targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.arg) and _annotated_scheduler(node):
            bound.add(node.arg)

    def is_scheduler(expr: ast.AST) -> bool:
        if isinstance(expr, ast.Name):
            return expr.id in bound
        return isinstance(expr, ast.Attribute) and expr.attr in RECEIVER_NAMES

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in internals and is_scheduler(node.value):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
              and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
              and node.args[1].value in internals and is_scheduler(node.args[0])):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_internals_include_the_request_table_resources_and_costs():
    internals = scheduler_internals()
    assert {"requests", "resources", "costs", "stats"} <= internals
    assert not internals & {"plan", "commit", "complete", "is_live", "snapshot", "seed_costs", "catalog"}


def test_the_check_catches_reads_of_scheduler_internals():
    internals = scheduler_internals()
    bad = """
def f(self, runtime, catalog, s2: SchedulerProtocol):
    self.scheduler.requests
    runtime.scheduler.resources.free_slots
    s = Scheduler(catalog)
    s.costs.observe(1, 2, 3)
    getattr(sched, "costs", None)
    s2.stats
"""
    assert len(violations(bad, internals)) == 5
    fine = """
def f(self, core, driver):
    self.scheduler.is_live(1)
    self.scheduler.snapshot().free_slots
    core.requests
    driver.requests
    self.stats.faults
"""
    assert violations(fine, internals) == []


def test_no_module_outside_the_schedulers_reads_scheduler_internals():
    """Callers use only the protocol: is_live, snapshot, seed_costs and the spec's API."""
    internals = scheduler_internals()
    found = []
    for path in sorted(HELIOS.rglob("*.py")) + sorted(BENCH.glob("*.py")):
        if any(path.is_relative_to(p) for p in SCHEDULER_PACKAGES):
            continue
        found += [f"{path.relative_to(HELIOS.parent)}:{v}" for v in violations(path.read_text(), internals)]
    assert found == [], "\n".join(found)


# The decisions and their outcomes: only the step loop plans, commits, completes and reports
# publications, so every host follows its one detach rule and one publication rule.
STEP_CALLS = {"plan", "commit", "complete", "complete_with_survival", "complete_packed_round",
              "complete_packed_round_with_survival", "published_output", "published_outputs"}
STEP_LOOP = HELIOS / "runtime" / "step.py"
# The overhead bench times these calls one by one on a bare scheduler (owned by the
# scheduler-internal half of issue 9, which may move it onto the step loop).
TIMES_THE_CALLS = {HELIOS / "sim" / "overhead.py"}


def test_only_the_step_loop_plans_commits_completes_and_publishes():
    """One step loop: the server runtime, the synchronous driver and the simulator drive their
    scheduler through helios.runtime.step.StepLoop rather than calling it themselves."""
    found = []
    for path in sorted(HELIOS.rglob("*.py")):
        if any(path.is_relative_to(p) for p in SCHEDULER_PACKAGES) or path == STEP_LOOP or path in TIMES_THE_CALLS:
            continue
        found += [f"{path.relative_to(HELIOS.parent)}:{v}" for v in violations(path.read_text(), STEP_CALLS)]
    assert found == [], "\n".join(found)
    assert len(violations(STEP_LOOP.read_text(), STEP_CALLS)) >= 7  # the check does see the loop's calls


class ProtocolOnly:
    """A scheduler seen through SchedulerProtocol alone: reading any other member fails."""

    def __init__(self, inner):
        object.__setattr__(self, "_inner", inner)

    def __getattr__(self, name):
        assert name in protocol_members(), f"a caller read scheduler.{name}, outside the protocol"
        return getattr(self._inner, name)


def test_every_host_runs_on_the_protocol_alone():
    """The same rule at run time, which also sees receivers the source check cannot name: the
    simulator, the synchronous driver, the server runtime with its metrics, and the warm-up."""
    from helios.engine.echo_core import AffineCost
    from helios.engine.sim_core import SimCore
    from helios.prepare import ordinary_catalog
    from helios.runtime.driver import SyncDriver
    from helios.runtime.runtime import Runtime
    from helios.scheduler import RequestSpec, Scheduler
    from helios.server.metrics import ServerMetrics
    from helios.sim.experiment import warm_up
    from helios.sim.loop import Arrival, Simulation

    catalog = ordinary_catalog(max_batch=4, prefill_chunks=(64,))

    def fresh():
        return ProtocolOnly(Scheduler(catalog, config=SchedulerConfig(request_slots=4, kv_pages=256)))

    sched = fresh()
    warm_up(sched, catalog, AffineCost(), 64)
    sim = Simulation(sched, SimCore(catalog, AffineCost(), seed=0))
    sim.add([Arrival(0, RequestSpec(70, 4), output_len=3), Arrival(0, RequestSpec(30, 4))])
    sim.cancel_at(1, 1)
    sim.run()
    assert sim.logs[0].finish is not None and not sched.is_live(1)

    driver = SyncDriver(fresh(), SimCore(catalog, AffineCost(), seed=0), clock=lambda: 0)
    driver.submit([1] * 70, 4)
    driver.run()

    metrics = ServerMetrics()
    with Runtime(fresh(), SimCore(catalog, AffineCost(), seed=0)) as runtime:
        metrics.attach(runtime)
        stream = runtime.submit([1] * 70, max_tokens=4)
        assert stream.wait(30) and stream.finish_reason == "length"
        assert runtime.wait_idle(30)
        assert b"flare_request_slots_free 4.0" in metrics.render()

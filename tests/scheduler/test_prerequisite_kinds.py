"""The prerequisite registry (prerequisite_kinds.py): every registered step names a kind and a hook
that kind implements, a catalog without state or vision graphs runs no step, and a new kind joins
through one factory and its steps alone (here a toy kind that holds one request back)."""

from __future__ import annotations

import numpy as np

import helios.scheduler.prerequisite_kinds as registry
from helios.graphs import GraphKind, GraphShape
from helios.scheduler.prerequisite import Prerequisite

from tests.scheduler.conftest import decode, drain, make, prefill, spec

SNAP, REST, V1 = GraphShape(GraphKind.SNAPSHOT, 1), GraphShape(GraphKind.RESTORE, 1), GraphShape(GraphKind.VISION, 1, 200)
TEXT = {decode(1): 10, decode(4): 14, prefill(64): 30, prefill(256): 80}


def test_every_step_names_a_registered_kind_and_a_hook_it_implements():
    s = make({**TEXT, SNAP: 2, REST: 3, V1: 20})
    names = [n for n, _ in registry.KINDS]
    for hook, steps in registry.ORDER.items():
        for name, method in steps:
            assert name in names, (hook, name)
            kind = s.prereqs.kinds[name]
            # Not the protocol's no-op: a registered step does something.
            assert getattr(type(kind), method) is not getattr(Prerequisite, method, None), (hook, name, method)


def test_a_catalog_without_state_or_vision_graphs_runs_no_step():
    p = make(TEXT).prereqs
    assert not p.proposes and not p.completes and not p.edits_output
    assert all(not steps for steps in p._steps.values())
    both = make({**TEXT, SNAP: 2, REST: 3, V1: 20}).prereqs
    assert both.proposes and both.completes and both.edits_output


class Hold(Prerequisite):
    """A toy kind: requests whose prompt is 77 tokens wait until `released`."""

    name = "hold"
    enabled = True

    def __init__(self):
        self.held, self.released = set(), False

    @classmethod
    def build(cls, b):
        return cls()

    def admitted(self, handle, request, checked, estimate_ns):
        if request.prompt_tokens == 77:
            self.held.add(handle)

    def pending(self):
        return bool(self.held) and not self.released

    def hold_back(self, t, rows):
        if self.released or not self.held:
            return rows
        return rows[~np.isin(t.handle[rows], np.array(sorted(self.held)))]


def test_a_new_kind_joins_through_one_factory_and_its_steps(monkeypatch):
    monkeypatch.setattr(registry, "KINDS", registry.KINDS + (("hold", Hold.build),))
    order = dict(registry.ORDER)
    for hook in ("admitted", "pending", "hold_back"):
        order[hook] = order[hook] + (("hold", hook),)
    monkeypatch.setattr(registry, "ORDER", order)
    s = make(TEXT)
    held = s.admit(spec(prompt=77, out=2), 0)
    free = s.admit(spec(prompt=50, out=2), 0)
    log, _ = drain(s)
    served = {int(h) for p, _ in log for h in p.handles}
    assert served == {free} and s.is_live(held)  # held back by the new kind alone
    s.prereqs.kinds["hold"].released = True
    log, _ = drain(s, fence=100)
    assert {int(h) for p, _ in log for h in p.handles} == {held} and not s.is_live(held)

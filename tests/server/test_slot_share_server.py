"""The server's side of client slot shares (issue 42): the scheduler's client is the unit of fair
admission (`user`, else the address), `--slot-share` reaches the Helios scheduler's config, and a
freed slot goes to a client holding none before a greedy client's waiters."""

from __future__ import annotations

import threading

from fastapi.testclient import TestClient

from helios.cli import build_parser
from helios.server.app import ServerSettings, create_app
from helios.server.backend import EngineOptions, build_backend

from .support import wait_for
from .test_api import CoreGate, make_client, service


def test_the_scheduler_prices_the_admission_client():
    with make_client(pace=0.0) as c:
        sched = service(c).runtime.scheduler
        seen = []
        admit = sched.admit
        sched.admit = lambda spec, now: (seen.append(spec.client), admit(spec, now))[1]
        for body in ({"prompt": "a", "max_tokens": 2, "user": "alice"}, {"prompt": "b", "max_tokens": 2}):
            assert c.post("/v1/completions", json=body).status_code == 200
        assert seen == ["alice", "addr:testclient"]  # `user`, else the TestClient's address
        assert sched.config.slot_share  # on by default


def test_slot_share_off_and_baselines_keep_the_spec_behaviour():
    args = build_parser().parse_args(["run", "--engine", "sim", "--slot-share", "off"])
    assert args.slot_share == "off"
    off = build_backend(EngineOptions(engine="sim", slot_share=False))
    assert not off.scheduler.config.slot_share
    fcfs = build_backend(EngineOptions(engine="sim", scheduler="vllm-fcfs"))
    assert not fcfs.scheduler.config.slot_share


def _slot_order(slot_share: bool) -> list[str]:
    """Two slots; client alice's first request (12 tokens) runs, its first frame held, while she
    sends three more (40 tokens) and then bob one. Returns the clients in the order their requests
    first got a slot."""
    backend = build_backend(EngineOptions(engine="sim", slots=2, max_context=256, prefill_capacity=256, sim_pace=0.0,
                                          slot_share=slot_share))
    with TestClient(create_app(backend, ServerSettings(max_queue=8))) as c:
        s = service(c)
        sched = s.runtime.scheduler
        client_of, order = {}, []
        admit, commit = sched.admit, sched.commit

        def spy_admit(spec, now):
            handle = admit(spec, now)
            client_of[handle] = spec.client
            return handle

        def spy_commit(plan, fence):
            order.extend(client_of[lane.handle] for lane in plan.lanes
                         if lane.slot is None and client_of.get(lane.handle) is not None)
            for lane in plan.lanes:
                client_of[lane.handle] = None if lane.slot is None else client_of.get(lane.handle)
            commit(plan, fence)
        sched.admit, sched.commit = spy_admit, spy_commit
        gate = CoreGate(s.backend.core)
        posts = []

        def post(user, tokens):
            body = {"prompt": f"hello {user} {len(posts)}", "max_tokens": tokens, "user": user}
            posts.append(threading.Thread(target=lambda: c.post("/v1/completions", json=body)))
            posts[-1].start()
        post("alice", 12)
        wait_for(lambda: gate.entered.is_set(), 30, "alice's first frame")  # held until released
        for _ in range(3):
            post("alice", 40)
        wait_for(lambda: s.live == 4, 30, "alice's four requests admitted")
        post("bob", 4)
        wait_for(lambda: s.live == 5, 30, "bob admitted")
        gate.release.set()
        for t in posts:
            t.join(60)
        return order


def test_a_freed_slot_goes_to_the_client_holding_none_before_the_greedy_clients_waiters():
    # The sim engine has no snapshot graphs, so this is slot admission alone: the free slot goes to
    # bob (holding none) before alice's waiters, which arrived first and are priced higher; without
    # the share bob waits behind all three.
    assert _slot_order(True) == ["alice", "bob", "alice", "alice", "alice"]
    assert _slot_order(False) == ["alice", "alice", "alice", "alice", "bob"]

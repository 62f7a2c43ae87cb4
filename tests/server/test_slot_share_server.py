"""The server's side of client slot shares (issue 42): the scheduler's client is the unit of fair
admission (`user`, else the address), and `--slot-share` reaches the Helios scheduler's config."""

from __future__ import annotations

from helios.server.backend import EngineOptions, build_backend
from helios.cli import build_parser

from .test_api import make_client, service


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

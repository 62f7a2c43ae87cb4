"""`flare sim run` writes a run's decision log; `flare sim explain` says why a request waited.

Rules: the RUN directory holds every decision of the run (as many as graphs ran) and every
request; the explanation of a request's wait counts exactly the decisions between its arrival and
its first output, names what ran instead, and lists the best graph that would have served it with
its rate against the winner's, from the logged numbers.
"""

from __future__ import annotations

import json
import re

import pytest

from helios.cli import main
from helios.sim.explain import explain, load_run


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "RUN"
    assert main(["sim", "run", "--out", str(out), "--trace", "azure", "--load", "0.9", "--window-s", "12",
                 "--cost-model", "h100-70b"]) == 0
    return out


def test_the_run_directory_holds_every_decision_and_request(run_dir):
    meta, requests, decisions = load_run(run_dir)
    assert meta["decisions"] == len(decisions) > 50 and meta["requests"] == len(requests)
    assert [d["seq"] for d in decisions] == list(range(1, len(decisions) + 1))
    assert all(d["measured_ms"] is not None for d in decisions)
    served = {r["handle"] for d in decisions for r in d["cohort"]}
    assert served == set(requests)  # every request ran in some logged decision


def _longest_wait(requests):
    return max(requests.values(), key=lambda r: r["first_output_s"] - r["arrival_s"])


def test_explain_request_counts_the_decisions_of_its_wait_and_what_ran_instead(run_dir, capsys):
    meta, requests, decisions = load_run(run_dir)
    req = _longest_wait(requests)
    h, start, end = req["handle"], req["arrival_s"], req["first_output_s"]
    during = [d for d in decisions if start <= d["t"] < end]
    assert main(["sim", "explain", str(run_dir), "--request", str(h)]) == 0
    text = capsys.readouterr().out
    assert f"waited {end - start:.3f} s" in text
    assert f"{len(during)} decisions in that time" in text
    served = [d for d in during if any(r["handle"] == h for r in d["cohort"])]
    assert f"It was served {len(served)} times" in text or not served
    others = [d for d in during if d not in served]
    top_graph = max({d["graph"] for d in others}, key=lambda g: sum(d["graph"] == g for d in others))
    assert top_graph in text.split("What ran instead", 1)[1].splitlines()[0]
    # Each listed decision: its time, winner and rate as logged, and the best graph serving the request.
    rows = re.findall(r"^\s+(\d+\.\d{3})\s+(\S+)\s+(\S+)\s+\d+/\d+\s+(.*)$", text, re.M)
    assert rows
    by_t = {f"{d['t']:.3f}": d for d in during}
    for t, graph, rate, best in rows:
        d = by_t[t]
        assert graph == d["graph"] and float(rate) == pytest.approx(d["value_rate"], rel=1e-3)
        alt = next((a for a in d["alternatives"] if a["cohort"] and any(r["handle"] == h for r in a["cohort"])), None)
        assert (alt is None) == best.startswith("none evaluated")
        if alt is not None:
            assert best.startswith(alt["graph"])


def test_explain_at_a_time_shows_the_decision_in_force(run_dir):
    _, _, decisions = load_run(run_dir)
    d = decisions[len(decisions) // 2]
    text = explain(run_dir, at=d["t"])
    assert text.startswith(f"decision #{d['seq']} at {d['t']:.3f} s: {d['graph']}")
    for a in d["alternatives"]:
        assert f"rejected {a['graph']}" in text


def test_explain_refuses_a_missing_run_or_request(run_dir, tmp_path, capsys):
    assert main(["sim", "explain", str(tmp_path), "--request", "0"]) == 2
    assert main(["sim", "explain", str(run_dir), "--request", "99999"]) == 2
    assert "no request 99999" in capsys.readouterr().err
    assert json.loads((run_dir / "run.json").read_text())["scheduler"] == "helios-balanced"

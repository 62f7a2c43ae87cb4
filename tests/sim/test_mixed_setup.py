"""`--mixed-prefill` in the simulator: Helios gets the mixed catalog, the baselines never do."""

from __future__ import annotations

import pytest

from helios.graphs import GraphKind
from helios.sim.experiment import HELIOS_SCHEDULERS, SCHEDULERS, Setup, run_trace, setup_from_flags

MIXED_SETUP = Setup(request_slots=16, mixed_prefill=True)
WINDOW = 8.0  # seconds of the Azure trace: ~10 requests


@pytest.mark.parametrize("name", SCHEDULERS)
def test_only_helios_gets_the_mixed_catalog(name):
    helios = name in HELIOS_SCHEDULERS
    assert MIXED_SETUP.mixed_for(name) is helios
    assert not Setup().mixed_for(name)
    catalog = MIXED_SETUP.catalog(mixed=MIXED_SETUP.mixed_for(name))
    assert bool(catalog.of_kind(GraphKind.MIXED)) is helios


def test_the_simulated_engine_prepares_the_fine_ladder_up_to_1600_prompt_tokens_and_prefill_up_to_2048():
    from helios.errors import ConfigError
    from helios.prepare import prompt_buckets

    catalog = MIXED_SETUP.catalog(mixed=True)
    # Twelve buckets per factor of four up to 1,600; no prefill graph takes more than 2,048 prompt tokens.
    assert sorted({s.prefill_capacity for s in catalog.of_kind(GraphKind.MIXED)}) == list(prompt_buckets(1600, 12))
    prefill = catalog.of_kind(GraphKind.PREFILL)
    assert max(s.batch_capacity * s.token_capacity for s in prefill) == 2048
    assert {s.token_capacity for s in prefill} == {64, 128, 256, 512, 1024, 2048}
    full = Setup(request_slots=16, mixed_prefill=True, prefill_capacity=4096, mixed_prompt_capacity=2048)
    assert max(s.token_capacity for s in full.catalog().of_kind(GraphKind.PREFILL)) == 4096
    coarse = Setup(request_slots=16, mixed_prefill=True, mixed_prompt_steps=3, mixed_prompt_capacity=None,
                   prefill_capacity=None)
    mixed = coarse.catalog(mixed=True).of_kind(GraphKind.MIXED)
    assert sorted({s.prefill_capacity for s in mixed}) == list(prompt_buckets(4096))
    with pytest.raises(ConfigError, match="mixed_prompt_steps"):
        Setup(mixed_prompt_steps=0)
    with pytest.raises(ConfigError, match="mixed_prompt_capacity"):
        Setup(mixed_prompt_capacity=100)


@pytest.mark.parametrize("name", ["helios-balanced", "sarathi"])
def test_a_mixed_run_finishes_every_request(name):
    r = run_trace(name, "azure", window_s=WINDOW, scale=1.0, setup=MIXED_SETUP, seed=0, progress=False)
    assert r.metrics.finished == r.metrics.requests > 0
    kinds = {t.shape.kind for t in r.sim.scheduler.traces}
    if name == "sarathi":
        assert GraphKind.MIXED not in kinds
    else:
        assert {s.kind for s in r.sim.scheduler.catalog} >= {GraphKind.MIXED}


def test_a_bad_mixed_capacity_is_a_one_line_report_error(tmp_path, capsys):
    from helios.cli import main

    code = main(["sim", "report", "--quick", "--mixed-prefill", "--mixed-prompt-capacity", "100",
                 "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("flare sim report: mixed_prompt_capacity:") and err.count("\n") == 1
    assert not any(tmp_path.iterdir())


def test_a_prefill_capacity_bounds_every_prefill_graph_and_the_mixed_ladder():
    """`--prefill-capacity 1024`: no prefill graph takes more than 1,024 prompt tokens in all (no longer
    chunk, and no 2 x 1,024 or 4 x 1,024 graph), shorter chunks still batch up to it, and the mixed
    ladder stops at the same 1,024 (it never exceeds the largest chunk)."""
    from helios.errors import ConfigError
    from helios.prepare import prompt_buckets

    capped = Setup(request_slots=16, mixed_prefill=True, prefill_capacity=1024, mixed_prompt_capacity=None)
    prefill = capped.catalog().of_kind(GraphKind.PREFILL)
    assert max(s.token_capacity for s in prefill) == 1024
    assert {(s.batch_capacity, s.token_capacity) for s in prefill} >= {(1, 1024), (2, 512), (16, 64)}
    assert max(s.batch_capacity * s.token_capacity for s in prefill) == 1024
    mixed = capped.catalog(mixed=True).of_kind(GraphKind.MIXED)
    assert sorted({s.prefill_capacity for s in mixed}) == list(prompt_buckets(1024, 12))
    assert Setup(prefill_capacity=None).chunks == Setup().prefill_chunks  # None: the largest chunk
    assert Setup(prefill_capacity=8192).chunks == Setup().prefill_chunks  # above it: binds nothing
    assert Setup(prefill_chunks=(64, 256)).chunks == (64, 256)  # so the default fits a smaller engine
    # A flag left out (None) keeps the default engine; a given one replaces it.
    assert setup_from_flags(prefill_capacity=None, mixed_prompt_capacity=None) == Setup()
    assert setup_from_flags(prefill_capacity=1024).chunks == (64, 128, 256, 512, 1024)
    for bad in (100, 3000):
        with pytest.raises(ConfigError, match="prefill_capacity"):
            Setup(prefill_capacity=bad)


def test_a_bad_prefill_capacity_is_a_one_line_report_error(tmp_path, capsys):
    from helios.cli import main

    code = main(["sim", "report", "--quick", "--prefill-capacity", "3000", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("flare sim report: prefill_capacity:") and err.count("\n") == 1
    assert not any(tmp_path.iterdir())


def test_a_prefill_capacity_leaves_the_workload_s_load_and_slos_alone():
    """Load and SLOs measure the workload: with or without the 4,096-token chunk an engine is held to the
    same SLOs at the same load (before, both followed the capped catalog: Mooncake's TTFT SLO fell from
    6,988 to 6,788 ms)."""
    from helios.sim.experiment import default_slo, nominal_load
    from helios.sim.traces import TraceRequest

    requests = [TraceRequest(i * 10**8, prompt, 200) for i, prompt in enumerate((300, 3000, 8000, 12000) * 5)]
    full, capped = Setup(), Setup(prefill_capacity=512)
    assert default_slo(requests, capped) == default_slo(requests, full)
    assert nominal_load(requests, 2 * 10**9, capped) == nominal_load(requests, 2 * 10**9, full)
    assert max(s.token_capacity for s in capped.catalog().of_kind(GraphKind.PREFILL)) == 512

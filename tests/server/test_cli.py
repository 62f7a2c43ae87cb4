"""`flare run` flags (one-line errors naming the flag, exit 2) and SIGTERM as a bounded drain."""

from __future__ import annotations

import threading

import httpx
import pytest

from helios.cli import build_parser, main
from helios.config import BALANCED_ADAPTATION_MS, PolicyConfig, PromptRateLaw, StudyConfig, preset
from helios.errors import ConfigError
from helios.server.command import _FLAGS

from .support import FlareServer, metrics, value, wait_for, wait_resources_free


@pytest.mark.parametrize("argv,flag", [
    (["--slots", "0"], "--slots"),
    (["--slots", "many"], "--slots"),
    (["--slots", "65", "--engine", "sim"], "--slots"),
    (["--scheduler-policy", "fastest"], "--scheduler-policy"),
    (["--scheduler", "round-robin"], "--scheduler"),
    (["--scheduler-terminal-value", "-1"], "--scheduler-terminal-value"),
    (["--scheduler-terminal-value", "inf"], "--scheduler-terminal-value"),
    (["--scheduler-terminal-age-price", "nan"], "--scheduler-terminal-age-price"),
    (["--mtp-adaptive-verification-alpha", "0"], "--mtp-adaptive-verification-alpha"),
    (["--scheduler-adaptation-ms", "0"], "--scheduler-adaptation-ms"),
    (["--scheduler-adaptation-ms", "inf"], "--scheduler-adaptation-ms"),
    (["--speculation", "sometimes"], "--speculation"),
    (["--speculative-token-capacity", "0"], "--speculative-token-capacity"),
    (["--prefill-capacity", "100", "--engine", "sim"], "--prefill-capacity"),
    (["--prefill-capacity", "4096", "--max-context", "1024", "--engine", "sim"], "--prefill-capacity"),
    (["--max-context", "-5"], "--max-context"),
    (["--max-queue", "-1"], "--max-queue"),
    (["--port", "70000"], "--port"),
    (["--model", "/nonexistent/model.gguf"], "--model"),
    (["--device", "toaster"], "--device"),
    (["--preemption", "sometimes"], "--preemption"),
    (["--preemption-quantum-ms", "-1"], "--preemption-quantum-ms"),
    (["--preemption-price-ratio", "0.5"], "--preemption-price-ratio"),
    (["--mixed-prompt-steps", "0"], "--mixed-prompt-steps"),
    (["--mixed-prefill", "--mixed-prompt-capacity", "100", "--engine", "sim"], "--mixed-prompt-capacity"),
    (["--mixed-prefill", "--mixed-prompt-capacity", "512", "--engine", "sim"], "--mixed-prompt-capacity"),
    (["--mixed-prompt-rows", "0"], "--mixed-prompt-rows"),
    (["--mixed-prefill", "--mixed-prompt-rows", "65", "--engine", "sim"], "--mixed-prompt-rows"),
    (["--class-gap-bound", "1.5", "--engine", "sim"], "--class-gap-bound"),
    (["--class-gap-bound", "0.9", "--engine", "sim", "--scheduler", "sarathi"], "--class-gap-bound"),
])
def test_invalid_flags_exit_2_with_one_line(capsys, argv, flag):
    try:
        code = main(["run", *argv])
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("flare run: error:"), err
    assert flag in err, err


def test_adaptation_constant_reaches_the_scheduler():
    """--scheduler-adaptation-ms overrides the policy preset's rate time constant; unset, the
    preset's stays (bench/decode_batch.py shows why a CPU may want a larger one)."""
    from helios.server import EngineOptions, build_backend

    assert build_backend(EngineOptions(engine="sim", adaptation_ms=750.0)).scheduler.policy.adaptation_ms == 750.0
    assert build_backend(EngineOptions(engine="sim")).scheduler.policy.adaptation_ms == BALANCED_ADAPTATION_MS
    assert build_parser().parse_args(["run", "--scheduler-adaptation-ms", "250"]).scheduler_adaptation_ms == 250.0


@pytest.mark.parametrize("flag", ["--scheduler-stall-bound-ms", "--scheduler-prompt-rate-law"])
def test_study_switches_are_not_flags_of_flare_run(capsys, flag):
    """Study switches (StudyConfig) are not operator knobs: `flare run` refuses them (the duration
    bound is one the spec forbids); `flare sim --scheduler 'helios-balanced[key=value]'` keeps them."""
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["run", flag, "350"])
    assert exc.value.code == 2 and flag in capsys.readouterr().err


def test_the_policy_presets_reach_the_scheduler_with_their_study_switches():
    """balanced (the default) serves PolicyConfig() with StudyConfig(); spec serves the spec's table
    with every study switch off (docs/scheduling-utility.md, "Deviations from the spec")."""
    from helios.server import EngineOptions, build_backend

    balanced = build_backend(EngineOptions(engine="sim")).scheduler
    assert balanced.policy == PolicyConfig() and balanced.study == StudyConfig()
    assert balanced.study.prompt_rate_law is PromptRateLaw.EWMA and balanced.study.stall_bound_ms is None
    spec = build_backend(EngineOptions(engine="sim", policy="spec")).scheduler
    assert spec.policy == preset("spec") and spec.policy.adaptation_ms == 100.0
    assert spec.study == StudyConfig.spec()
    assert build_parser().parse_args(["run", "--scheduler-policy", "spec"]).scheduler_policy == "spec"


def test_the_mixed_prompt_ladder_reaches_the_catalog():
    """--mixed-prompt-steps sets the mixed catalog's prompt buckets per factor of four (default 3,
    the spec's ladder); a bad value from the API is a ConfigError naming it."""
    from helios.errors import ConfigError
    from helios.graphs import GraphKind
    from helios.prepare import prompt_buckets
    from helios.server import EngineOptions, build_backend

    def ladder(**kw):
        options = EngineOptions(engine="sim", mixed_prefill=True, prefill_capacity=1024, max_context=2048, **kw)
        mixed = build_backend(options).scheduler.catalog.of_kind(GraphKind.MIXED)
        return sorted({s.prefill_capacity for s in mixed})

    assert ladder() == list(prompt_buckets(1024)) == [64, 128, 192, 256, 384, 640, 1024]
    assert ladder(mixed_prompt_steps=12) == list(prompt_buckets(1024, 12))
    assert build_parser().parse_args(["run", "--mixed-prompt-steps", "6"]).mixed_prompt_steps == 6
    assert ladder(mixed_prompt_steps=12, mixed_prompt_capacity=512) == list(prompt_buckets(512, 12))
    with pytest.raises(ConfigError, match="mixed_prompt_steps"):
        build_backend(EngineOptions(engine="sim", mixed_prefill=True, mixed_prompt_steps=0))


def test_mixed_prompt_rows_reach_the_catalog():
    """--mixed-prompt-rows R: each mixed graph packs up to min(R, B) prompt rows (default 1, the
    spec's one prompt row; docs/packed-prompt-rows.md)."""
    from helios.graphs import GraphKind
    from helios.server import EngineOptions, build_backend

    def rows(**kw):
        options = EngineOptions(engine="sim", mixed_prefill=True, prefill_capacity=1024, max_context=2048, **kw)
        return {(s.batch_capacity, s.prompt_rows) for s in build_backend(options).scheduler.catalog.of_kind(GraphKind.MIXED)}

    assert {r for _, r in rows()} == {1}
    assert build_parser().parse_args(["run", "--mixed-prompt-rows", "3"]).mixed_prompt_rows == 3
    assert all(r == min(3, b) for b, r in rows(mixed_prompt_rows=3))


def test_class_gap_bound_reaches_the_scheduler_and_is_off_by_default():
    """--class-gap-bound F (outside the spec): StudyConfig.class_gap_bound; unset, the spec's behaviour."""
    from helios.server import EngineOptions, build_backend

    assert build_parser().parse_args(["run"]).class_gap_bound is None
    assert build_parser().parse_args(["run", "--class-gap-bound", "0.9"]).class_gap_bound == 0.9
    assert build_backend(EngineOptions(engine="sim")).scheduler.study.class_gap_bound is None
    assert build_backend(EngineOptions(engine="sim", class_gap_bound=0.9)).scheduler.study.class_gap_bound == 0.9


def test_preemption_flags_reach_the_helios_scheduler_only():
    """--preemption is on by default with the Helios scheduler (it acts where the catalog has
    snapshot and restore graphs: not the sim engine's); baselines never get it."""
    from helios.config import PreemptionPolicy
    from helios.server import EngineOptions, build_backend

    args = build_parser().parse_args(["run", "--preemption-quantum-ms", "250", "--preemption-price-ratio", "2"])
    assert (args.preemption, args.preemption_quantum_ms, args.preemption_price_ratio) == ("price", 250.0, 2.0)
    sched = build_backend(EngineOptions(engine="sim", preemption_quantum_ms=250.0)).scheduler
    assert sched.config.preemption.policy is PreemptionPolicy.PRICE and sched.config.preemption.quantum_ms == 250.0
    assert not sched.preempts  # no snapshot or restore graphs in the sim engine's catalog
    off = build_backend(EngineOptions(engine="sim", preemption="off")).scheduler.config.preemption
    assert off.policy is PreemptionPolicy.OFF
    baseline = build_backend(EngineOptions(engine="sim", scheduler="sarathi")).scheduler.config.preemption
    assert baseline.policy is PreemptionPolicy.OFF


def test_defaults():
    args = build_parser().parse_args(["run"])
    assert (args.engine, args.scheduler, args.scheduler_policy, args.speculation) == ("torch", "helios", "balanced", "off")
    assert (args.host, args.port, args.slots, args.max_context, args.model) == ("127.0.0.1", 8000, None, None, None)


def test_sigterm_drains_and_exits_zero():
    """Rule: SIGTERM refuses new work with 503 while draining, ends a request that outlives the
    grace period with a clear 503, and exits 0; nothing hangs (every wait has a deadline)."""
    # Paced 4x slower than simulated time: 1000 tokens take ~9 s, far past the 1 s grace.
    server = FlareServer("--engine", "sim", "--slots", "2", "--shutdown-grace", "1.0", "--max-context", "1024",
                         "--sim-pace", "4")
    assert server.ready_line == f"flare: serving helios-sim on {server.url}", server.error_text()
    try:
        result = {}

        def long_request():
            result["r"] = httpx.post(server.url + "/v1/completions",
                                     json={"prompt": "slow", "max_tokens": 1000}, timeout=60)

        t = threading.Thread(target=long_request)
        t.start()
        wait_for(lambda: value(metrics(server.url), "flare_requests_running") == 1, 30,
                 "the long request to be running")
        server.proc.send_signal(15)
        # Still listening while draining: new work is refused with 503, not hung.
        health = wait_for(lambda: _health_status(server.url) == 503 or None, 30, "/health to report draining")
        assert health
        r = httpx.post(server.url + "/v1/completions", json={"prompt": "new"}, timeout=10)
        assert r.status_code == 503 and r.json()["error"]["code"] == "shutting_down"
        assert server.proc.wait(60) == 0
        t.join(60)
        assert not t.is_alive(), "the in-flight request was never answered"
        # Cancelled at the end of the grace period, with a reason.
        assert result["r"].status_code == 503 and result["r"].json()["error"]["code"] == "cancelled"
    finally:
        server.stop()


def _health_status(url: str) -> int | None:
    try:
        return httpx.get(url + "/health", timeout=5).status_code
    except httpx.HTTPError:
        return None


@pytest.mark.parametrize("flags", [("--scheduler", "sarathi"), ("--speculation", "fixed")])
def test_sim_server_serves_and_frees_resources(flags):
    server = FlareServer("--engine", "sim", *flags)
    assert server.ready_line, server.error_text()
    try:
        r = httpx.post(server.url + "/v1/completions", json={"prompt": "abc", "max_tokens": 7}, timeout=30)
        assert r.json()["choices"][0]["text"] == "abcabca"
        snap = wait_resources_free(server.url)
        if "fixed" in flags:
            assert value(snap, "flare_speculative_programs_total") > 0
    finally:
        assert server.stop() == 0


def test_baseline_with_speculation_is_refused(capsys):
    assert main(["run", "--engine", "sim", "--scheduler", "vllm-fcfs", "--speculation", "fixed"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--scheduler" in err


def test_mixed_prefill_serves_and_reports_the_packed_extent():
    """`--mixed-prefill` adds the mixed catalog; the startup planning line gives its maximum packed
    extent: C + (B - 1) W = 256 + 3 x 1 for 4 slots and 256-token chunks."""
    server = FlareServer("--engine", "sim", "--slots", "4", "--mixed-prefill")
    assert server.ready_line, server.error_text()
    try:
        r = httpx.post(server.url + "/v1/completions", json={"prompt": "abc", "max_tokens": 7}, timeout=30)
        assert r.json()["choices"][0]["text"] == "abcabca"
        wait_resources_free(server.url)
        catalog_line = next(line for line in server.error_text().splitlines() if "catalog of" in line)
        assert "mixed" in catalog_line and catalog_line.endswith("maximum packed extent 259 tokens")
    finally:
        assert server.stop() == 0


def test_catalog_line_without_mixed_graphs():
    from helios.graphs import Catalog, GraphKind, GraphShape
    from helios.server.backend import describe_catalog

    line = describe_catalog(Catalog([GraphShape(GraphKind.DECODE, 1), GraphShape(GraphKind.PREFILL, 1, 64)]))
    assert line == "catalog of 2 graphs: 1 decode, 1 prefill"
    mixed = Catalog([GraphShape(GraphKind.DECODE, 2), GraphShape(GraphKind.MIXED, 2, 1, 0, 0, 64),
                     GraphShape(GraphKind.MIXED, 4, 1, 0, 0, 128)])
    assert describe_catalog(mixed).endswith("2 mixed; maximum packed extent 131 tokens")


def test_cpu_engine_line_names_weights_threads_and_the_faster_format():
    from helios.server.backend import describe_cpu_engine

    assert describe_cpu_engine("fp32", 2, False) == \
        "fp32 weights on up to 2 CPU threads (fewer while other processes use the CPUs)"
    assert describe_cpu_engine("fp32", 1, True).endswith(
        "1 CPU thread (fewer while other processes use the CPUs); this CPU multiplies bfloat16 natively: "
        "--weights bf16 is about 1.5x faster (other tokens)")
    assert "--weights bf16" not in describe_cpu_engine("bf16", 2, True)

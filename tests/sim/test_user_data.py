"""Users' own data for `flare sim report`: trace files (Azure CSV, Mooncake JSONL) and Vidur profiles,
with errors that name the missing column or the malformed line; seeds, windows and the 5% bisection."""

from __future__ import annotations

import json
import shutil

import pytest

from helios.cli import main
from helios.errors import ConfigError
from helios.graphs import GraphKind, GraphShape
from helios.sim.costmodel import VidurCostModel
from helios.sim.metrics import RunMetrics, goodput_sweep
from helios.sim.seeds import combine
from helios.sim.traces import default_data_dir, load_trace_file
from helios.sim.workload import load_workload, trace_label, trace_source, window_for

AZURE_ROWS = ["TIMESTAMP,ContextTokens,GeneratedTokens",
              "2023-11-16 18:15:46.6805900,374,44",
              "2023-11-16 18:15:47.1000000,90,12",
              "2023-11-16 18:15:48.0000000,1200,300"]
MOONCAKE_ROWS = [{"timestamp": 0, "input_length": 700, "output_length": 20, "hash_ids": [0, 1]},
                 {"timestamp": 1500, "input_length": 64, "output_length": 5, "hash_ids": [2]}]


def _write(path, lines):
    path.write_text("\n".join(lines) + "\n")
    return path


def test_trace_files_are_read_in_either_format_detected_or_named(tmp_path):
    azure = _write(tmp_path / "mine.csv", AZURE_ROWS)
    moon = _write(tmp_path / "moon.jsonl", [json.dumps(r) for r in MOONCAKE_ROWS])
    a = load_trace_file(azure)
    assert [(r.prompt_tokens, r.output_tokens) for r in a] == [(374, 44), (90, 12), (1200, 300)]
    assert a[1].arrival_ns == pytest.approx(0.4194100e9, abs=1e3)
    m = load_trace_file(moon, "mooncake")
    assert [(r.arrival_ns, r.prompt_tokens, r.prefix_blocks) for r in m] == [(0, 700, (0, 1)), (1_500_000_000, 64, (2,))]
    assert trace_source(str(azure)) == ("azure", str(azure)) and trace_source(f"mooncake:{moon}")[0] == "mooncake"
    assert trace_label(str(moon)) == "moon"
    assert len(load_workload(f"azure:{azure}", 60.0)) == 3


def test_a_missing_column_or_a_malformed_line_is_named(tmp_path):
    bad = _write(tmp_path / "bad.csv", ["TIMESTAMP,ContextTokens", "2023-11-16 18:15:46,5"])
    with pytest.raises(ConfigError, match="missing column.*GeneratedTokens"):
        load_trace_file(bad)
    worse = _write(tmp_path / "worse.csv", AZURE_ROWS[:2] + ["2023-11-16 18:15:47,ninety,12"])
    with pytest.raises(ConfigError, match="line 3"):
        load_trace_file(worse)
    broken = _write(tmp_path / "m.jsonl", [json.dumps(MOONCAKE_ROWS[0]), "{not json"])
    with pytest.raises(ConfigError, match="line 2: not JSON"):
        load_trace_file(broken)
    short = _write(tmp_path / "s.jsonl", [json.dumps({"timestamp": 0, "input_length": 5})])
    with pytest.raises(ConfigError, match="line 1: missing field.*output_length"):
        load_trace_file(short)
    with pytest.raises(ConfigError, match="not found"):
        load_trace_file(tmp_path / "absent.csv")
    with pytest.raises(ConfigError, match="unknown trace"):
        trace_source("no-such-trace")


def test_cli_report_on_a_user_trace_names_errors_without_a_traceback(tmp_path, capsys):
    azure = _write(tmp_path / "mine.csv", AZURE_ROWS)
    out = tmp_path / "r"
    assert main(["sim", "report", "--quick", "--trace", str(azure), "--schedulers", "sarathi",
                 "--out", str(out)]) == 0
    assert "| sarathi |" in (out / "report.md").read_text() and (out / "pareto_mine.png").is_file()
    bad = _write(tmp_path / "bad.csv", ["TIMESTAMP,Context", "x,1"])
    assert main(["sim", "report", "--quick", "--trace", str(bad), "--out", str(out)]) == 2
    assert "missing column(s) ContextTokens, GeneratedTokens" in capsys.readouterr().err


def _profile(tmp_path):
    data = default_data_dir()
    d = tmp_path / "profile"
    d.mkdir()
    shutil.copy(data / "vidur_h100_llama2-70b_mlp.csv", d / "mlp.csv")
    shutil.copy(data / "vidur_a100_llama2-70b-shape_tp2_attention.csv", d / "attention.csv")
    return d


def test_a_vidur_profile_directory_is_a_cost_model(tmp_path):
    d = _profile(tmp_path)
    model = VidurCostModel.from_profile_dir(d, overhead_ms=5.0)
    assert model.profile.tp == 1  # the smallest TP degree in the MLP file
    small = model.duration_ns(GraphShape(GraphKind.PREFILL, 1, 256), [0])
    large = model.duration_ns(GraphShape(GraphKind.PREFILL, 1, 2048), [0])
    assert 5_000_000 < small < large
    (d / "mlp.csv").write_text("num_tokens,n_embd\n1,8192\n")
    with pytest.raises(ConfigError, match="missing column.*num_tensor_parallel_workers"):
        VidurCostModel.from_profile_dir(d)
    (d / "mlp.csv").unlink()
    with pytest.raises(ConfigError, match="expected mlp.csv"):
        VidurCostModel.from_profile_dir(d)


def test_windows_hold_the_requested_number_of_requests():
    for trace in ("azure", "mooncake"):
        window = window_for(trace, 1000)
        assert len(load_workload(trace, window)) >= 1000
        assert len(load_workload(trace, window - 5.0)) < 1000


def _metrics(attainment):
    return RunMetrics(10, 10, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, None, attainment)


def test_goodput_bisection_stops_at_the_resolution():
    knee = 0.737
    sweep = goodput_sweep(lambda s: _metrics(1.0 if s <= knee else 0.5), (0.2, 0.4, 0.6, 0.8, 1.0),
                          refine=20, resolution=0.05)
    passing = [s for s, _, a in sweep.points if a >= 0.9]
    failing = [s for s, _, a in sweep.points if a < 0.9]
    assert max(passing) <= knee < min(failing) <= max(passing) * 1.05
    assert len(sweep.points) < 4 + 20  # stopped by the resolution, not the step cap


def test_seeds_combine_into_mean_and_range():
    class G:
        def __init__(self, goodput, status="bracketed"):
            self.goodput, self.status = goodput, status

    def task(att, goodput):
        return {"trace": "azure", "scheduler": "x", "goodput": G(goodput), "points": [(0.4, 1.0, att)],
                "runs": 3, "wall_s": 1.0,
                "loads": {0.4: {"scale": 0.3, "metrics": {"slo_attainment": att, "jain": None},
                                "ttft_ms": [1.0], "gaps_ms": [2.0]}}}

    c = combine([task(0.9, 1.0), task(0.7, 1.3), task(0.8, 1.6)])
    m = c["loads"][0.4]
    assert m["metrics"]["slo_attainment"] == pytest.approx(0.8) and m["range"]["slo_attainment"] == (0.7, 0.9)
    assert m["metrics"]["jain"] is None and list(m["ttft_ms"]) == [1.0] * 3
    assert c["goodput"].goodput == pytest.approx(1.3) and (c["goodput"].low, c["goodput"].high) == (1.0, 1.6)
    assert c["runs"] == 9 and len(c["points"]) == 3


def test_variant_names_keep_their_own_commas():
    from helios.cli import build_parser

    args = build_parser().parse_args(["sim", "report", "--ablation",
                                      "helios-balanced[stall_pricing=0,adaptation_ms=100],helios-balanced"])
    assert args.ablation == ["helios-balanced[stall_pricing=0,adaptation_ms=100]", "helios-balanced"]

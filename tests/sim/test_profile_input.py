"""Simulator inputs that used to be taken silently (issue 42).

Rules tested:
- an empty or non-numeric timing cell of a Vidur profile is an error naming file, line and column
  (it was read as 0, or raised without naming either); with repairs asked for, its row is
  dropped and the repair reported;
- a layer time that falls as tokens grow, past the stated tolerance, is an error naming file,
  line and column; with repairs, the isotonic fit smooths it and the repair is reported; a drop
  within the tolerance is not reported;
- every published profile in the data folder loads without a repair;
- `flare sim report --profile` stops with one line naming the cell (status 2);
- a trace row with a zero or negative token count is an error naming its line (it was clipped
  to 1 without a word).
"""

from __future__ import annotations

import csv
import json
import shutil

import pytest

from helios.cli import main
from helios.errors import ConfigError
from helios.sim.costmodel import PROFILES, VidurCostModel
from helios.sim.profile_input import MONOTONE_REL
from helios.sim.traces import default_data_dir, load_trace_file

UP = "time_stats.mlp_up_proj.median"


def _profile(tmp_path):
    data = default_data_dir()
    d = tmp_path / "profile"
    d.mkdir(parents=True)
    shutil.copy(data / "vidur_h100_llama2-7b_mlp.csv", d / "mlp.csv")
    shutil.copy(data / "vidur_a100_llama2-70b-shape_tp2_attention.csv", d / "attention.csv")
    return d


def _edit(path, match, column, value):
    """Set `column` of the first row matching `match` (a dict of cells); returns (line, column number)."""
    with open(path, newline="") as fh:
        rows = list(csv.reader(fh))
    header = rows[0]
    for i, row in enumerate(rows[1:], start=2):
        if all(row[header.index(k)] == v for k, v in match.items()):
            row[header.index(column)] = value
            break
    with open(path, "w", newline="") as fh:
        csv.writer(fh).writerows(rows)
    return i, header.index(column) + 1


@pytest.mark.parametrize("value,problem", [("", "empty cell"), ("n/a", "not a number")])
def test_an_empty_or_non_numeric_cell_is_named_or_its_row_dropped_and_reported(tmp_path, value, problem):
    d = _profile(tmp_path)
    line, col = _edit(d / "mlp.csv", {"num_tensor_parallel_workers": "1", "num_tokens": "512"}, UP, value)
    with pytest.raises(ConfigError, match=rf"mlp.csv:{line}:{col}: {UP}: {problem}"):
        VidurCostModel.from_profile_dir(d)
    repairs = []
    model = VidurCostModel.from_profile_dir(d, repairs=repairs)
    assert [(r.line, r.column) for r in repairs] == [(line, col)] and "row dropped" in str(repairs[0])
    clean = VidurCostModel.from_profile_dir(_profile(tmp_path / "clean"))
    assert model.linear.layer_ms(512) >= 0.95 * clean.linear.layer_ms(512)  # not cheaper, as a 0 read made it


def test_an_attention_cell_is_checked_where_its_row_uses_it(tmp_path):
    d = _profile(tmp_path)
    line, col = _edit(d / "attention.csv", {"is_prefill": "True"}, "time_stats.attn_prefill.median", "")
    with pytest.raises(ConfigError, match=rf"attention.csv:{line}:{col}: time_stats.attn_prefill.median"):
        VidurCostModel.from_profile_dir(d)


def test_a_layer_time_that_falls_as_tokens_grow_is_named_or_smoothed_and_reported(tmp_path):
    d = _profile(tmp_path)
    line, col = _edit(d / "mlp.csv", {"num_tensor_parallel_workers": "1", "num_tokens": "1024"}, UP, "0.001")
    with pytest.raises(ConfigError, match=rf"mlp.csv:{line}:{col}: {UP}: the layer time at 1024 tokens"):
        VidurCostModel.from_profile_dir(d)
    repairs = []
    VidurCostModel.from_profile_dir(d, repairs=repairs)
    assert [(r.line, r.column) for r in repairs] == [(line, col)] and "smoothed" in str(repairs[0])


def test_a_drop_within_the_tolerance_is_not_reported(tmp_path):
    d = _profile(tmp_path)
    with open(d / "mlp.csv", newline="") as fh:
        row = next(r for r in csv.DictReader(fh) if r["num_tensor_parallel_workers"] == "1"
                   and r["num_tokens"] == "1024")
    # the up projection dominates the layer: cut it by half the tolerance of the whole layer
    layer = sum(float(v) for k, v in row.items() if k.startswith("time_stats.") and k.endswith(".median")
                and "emb" not in k)
    _edit(d / "mlp.csv", {"num_tensor_parallel_workers": "1", "num_tokens": "1024"}, UP,
          str(float(row[UP]) - layer * MONOTONE_REL / 4))
    repairs = []
    VidurCostModel.from_profile_dir(d, repairs=repairs)
    assert repairs == []


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_every_published_profile_loads_without_a_repair(name):
    VidurCostModel.from_data(name)  # strict: a ProfileError would raise


def test_the_cli_names_the_cell_in_one_line(tmp_path, capsys):
    d = _profile(tmp_path)
    line, col = _edit(d / "mlp.csv", {"num_tensor_parallel_workers": "1", "num_tokens": "64"}, UP, "")
    assert main(["sim", "report", "--quick", "--profile", str(d), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"mlp.csv:{line}:{col}:" in err and "--profile-repair" in err


def test_a_trace_row_with_a_nonpositive_token_count_names_its_line(tmp_path):
    azure = tmp_path / "a.csv"
    azure.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,374,44\n"
                     "2023-11-16 18:15:47.10,-5,12\n")
    with pytest.raises(ConfigError, match=r"a.csv, line 3: ContextTokens must be a positive token count, got -5"):
        load_trace_file(azure)
    mooncake = tmp_path / "m.jsonl"
    mooncake.write_text(json.dumps({"timestamp": 0, "input_length": 7, "output_length": 2}) + "\n"
                        + json.dumps({"timestamp": 5, "input_length": 7, "output_length": 0}) + "\n")
    with pytest.raises(ConfigError, match=r"m.jsonl, line 2: output_length must be a positive token count"):
        load_trace_file(mooncake)

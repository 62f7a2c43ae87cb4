"""`flare run`'s weight format: the GGUF's own quantized weights by default on one CPU rank, fp32
where they have no kernel (other devices, tensor-parallel shards), and any explicit --weights as given."""

import pytest

from helios.cli import build_parser
from helios.server.backend import EngineOptions, weight_format


def test_no_flag_leaves_the_choice_to_the_backend():
    args = build_parser().parse_args(["run"])
    assert args.weights is None
    assert build_parser().parse_args(["run", "--weights", "gguf"]).weights == "gguf"


@pytest.mark.parametrize("options, expected", [
    (dict(), "gguf"),
    (dict(device="cuda"), "fp32"),
    (dict(device="cuda:1"), "fp32"),
    (dict(tensor_parallel=2), "fp32"),
    (dict(weights="fp32"), "fp32"),
    (dict(weights="bf16"), "bf16"),
    (dict(weights="gguf", device="cuda"), "gguf"),  # asked for: the core refuses it with a clear error
])
def test_the_default_is_the_files_weights_on_one_cpu_rank(options, expected):
    assert weight_format(EngineOptions(**{"weights": None, **options})) == expected


def test_a_hugging_face_directory_is_served_as_fp32_and_gguf_weights_for_it_are_refused(tmp_path):
    from helios.errors import ConfigError
    from helios.server.preflight import preflight

    assert weight_format(EngineOptions(weights=None, model=str(tmp_path))) == "fp32"
    assert weight_format(EngineOptions(weights=None, model=str(tmp_path / "m.gguf"))) == "gguf"
    with pytest.raises(ConfigError) as err:
        preflight(EngineOptions(engine="torch", weights="gguf", model=str(tmp_path)))
    assert err.value.field == "weights"

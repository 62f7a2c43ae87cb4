"""The simulator's prompt rows per mixed graph: the engine's `Setup.mixed_prompt_rows`
(`--mixed-prompt-rows`) and a report row's `[mixed_prompt_rows=N]` variant, which sets that row's
catalog and nothing in its scheduler configs (docs/packed-prompt-rows.md)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from helios.config import StudyConfig, preset
from helios.errors import ConfigError
from helios.graphs import GraphKind
from helios.sim.experiment import Setup, split_variant, variant_configs


def rows_of(catalog) -> set:
    return {(s.batch_capacity, s.prompt_rows) for s in catalog.of_kind(GraphKind.MIXED)}


def test_a_variant_sets_its_rows_catalog_and_not_its_configs():
    setup = Setup(mixed_prefill=True)
    # The simulator engine's default is the spec's form: four rows did not pay overall (docs/packed-prompt-rows.md).
    assert setup.mixed_prompt_rows == 1 and setup.prompt_rows_for("helios-balanced") == 1
    assert setup.prompt_rows_for("helios-balanced[mixed_prompt_rows=4]") == 4
    assert replace(setup, mixed_prompt_rows=4).prompt_rows_for("helios-balanced") == 4
    assert replace(setup, mixed_prompt_rows=4).prompt_rows_for("helios-balanced[mixed_prompt_rows=1]") == 1
    assert {r for _, r in rows_of(setup.catalog(mixed=True))} == {1}
    assert all(r == min(4, b) for b, r in rows_of(setup.catalog(mixed=True, prompt_rows=4)))
    assert all(r == min(2, b) for b, r in rows_of(setup.catalog(mixed=True, prompt_rows=2)))
    assert split_variant("helios-balanced[mixed_prompt_rows=2,stall_pricing=0]") == (
        "helios-balanced", {"mixed_prompt_rows": 2, "stall_pricing": False})
    assert variant_configs("helios-balanced[mixed_prompt_rows=2]") == (preset("balanced"), StudyConfig())


@pytest.mark.parametrize("bad", ["1.5", "0", "65", "none"])
def test_a_bad_rows_variant_is_a_config_error(bad):
    with pytest.raises(ConfigError):
        split_variant(f"helios-balanced[mixed_prompt_rows={bad}]")


def test_setup_validates_its_rows():
    with pytest.raises(ConfigError, match="mixed_prompt_rows"):
        Setup(mixed_prompt_rows=0)

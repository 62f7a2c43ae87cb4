"""Catalogs are built in one place (helios.prepare) from an engine's declared Capacities."""

import dataclasses

import pytest

from helios.config import SpeculationMode
from helios.engine.echo_core import EchoSimCore
from helios.errors import ConfigError
from helios.graphs import Catalog, GraphKind
from helios.prepare import Capacities, build_catalog, ordinary_catalog, prefill_chunks, with_speculation
from helios.server.backend import EngineOptions, build_backend
from helios.sim.experiment import SPEC_TOKEN_CAPACITY, SPEC_WIDTHS, Setup


def shapes(catalog: Catalog) -> list:
    return list(catalog)


def test_capacities_without_speculation_give_the_ordinary_catalog():
    c = Capacities(8, (256, 64), max_prefill_tokens=512, scored_prefill=True)
    assert c.prefill_chunks == (64, 256)
    assert shapes(build_catalog(c)) == shapes(ordinary_catalog(8, (64, 256), 512, scored_prefill=True))


@pytest.mark.parametrize("ragged", [True, False])
def test_speculative_capacities_replace_decode_with_speculative_programs(ragged):
    c = Capacities(4, (64,), speculation=SpeculationMode.ADAPTIVE, widths=(1, 2, 4),
                   speculative_token_capacity=8, ragged=ragged)
    catalog = build_catalog(c)
    assert not catalog.of_kind(GraphKind.DECODE)
    assert shapes(catalog) == shapes(with_speculation(ordinary_catalog(4, (64,)), 4, (1, 2, 4), 8, ragged))
    has_ragged = any(not s.rectangular for s in catalog.of_kind(GraphKind.SPECULATIVE))
    assert has_ragged is ragged


@pytest.mark.parametrize("field, kwargs", [
    ("max_batch", dict(max_batch=0, prefill_chunks=(64,))),
    ("prefill_chunks", dict(max_batch=4, prefill_chunks=())),
    ("max_prefill_tokens", dict(max_batch=4, prefill_chunks=(64,), max_prefill_tokens=32)),
    ("widths", dict(max_batch=4, prefill_chunks=(64,), widths=(0, 2))),
])
def test_invalid_capacities_name_their_field(field, kwargs):
    with pytest.raises(ConfigError) as info:
        Capacities(**kwargs)
    assert info.value.field == field


def test_prefill_chunks_are_powers_of_four_below_the_capacity():
    assert prefill_chunks(1024) == (64, 256, 1024)
    assert prefill_chunks(320) == (64, 256, 320)
    with pytest.raises(ConfigError) as info:
        prefill_chunks(100)
    assert info.value.field == "prefill_capacity"


def test_the_echo_engine_builds_its_catalog_from_its_capacities():
    c = Capacities(4, (64, 256), speculation=SpeculationMode.FIXED, widths=(1, 2, 4), speculative_token_capacity=16,
                   ragged=False)
    core = EchoSimCore(c, request_slots=4, max_context=512, pace=0)
    assert shapes(core.catalog) == shapes(build_catalog(c))
    config = core.scheduler_config()
    assert (config.request_slots, config.max_context, config.speculation, config.draft_capacity) == (
        4, 512, SpeculationMode.FIXED, 3)


@pytest.mark.parametrize("speculation, ragged", [("off", False), ("fixed", False), ("adaptive", True)])
def test_flare_run_sim_engine_serves_the_catalog_of_its_options(speculation, ragged):
    backend = build_backend(EngineOptions(engine="sim", speculation=speculation, slots=4, prefill_capacity=256))
    expected = Capacities(4, (64, 256), speculation=SpeculationMode(speculation), widths=(1, 2, 4),
                          speculative_token_capacity=16, ragged=ragged, scored_prefill=True)
    assert shapes(backend.core.catalog) == shapes(build_catalog(expected))
    assert backend.scheduler.catalog is backend.core.catalog
    plain = build_backend(EngineOptions(engine="sim", speculation=speculation, slots=4, prefill_capacity=256,
                                        scored_prefill=False))
    assert shapes(plain.core.catalog) == shapes(build_catalog(dataclasses.replace(expected, scored_prefill=False)))


def test_the_simulator_setup_declares_its_capacities():
    setup = Setup(request_slots=8, prefill_chunks=(64, 256))
    assert shapes(setup.catalog()) == shapes(ordinary_catalog(8, (64, 256), max_prefill_tokens=256))
    spec = setup.catalog(SpeculationMode.ADAPTIVE)
    assert shapes(spec) == shapes(with_speculation(setup.catalog(), 8, SPEC_WIDTHS, SPEC_TOKEN_CAPACITY))

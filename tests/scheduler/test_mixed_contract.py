"""The mixed execution contract, validated where a shape is built (spec: "Mixed execution
contract")."""

import pytest

from helios.errors import ConfigError, HeliosError
from helios.graphs import GraphKind, GraphShape

MIXED = GraphKind.MIXED


@pytest.mark.parametrize("b", [2, 4, 8, 16, 32, 64])
@pytest.mark.parametrize("w", [1, 2, 8])
def test_legal_mixed_shapes_and_their_packed_extent(b, w):
    shape = GraphShape(MIXED, b, w, w - 1, 0, 128)
    assert shape.target_capacity == b * w
    assert shape.max_packed_extent == 128 + (b - 1) * w


@pytest.mark.parametrize("kwargs, field", [
    (dict(batch_capacity=3), "batch_capacity"),
    (dict(batch_capacity=128), "batch_capacity"),
    (dict(batch_capacity=1), "batch_capacity"),
    (dict(prefill_capacity=100), "prefill_capacity"),
    (dict(prefill_capacity=0), "prefill_capacity"),
    (dict(token_capacity=0), "token_capacity"),
    (dict(token_capacity=8, proposal_depth=7, prefill_capacity=64), None),  # legal: C = 64 >= W = 8
    (dict(token_capacity=4, proposal_depth=4), "proposal_depth"),
    (dict(token_capacity=2, proposal_depth=1, target_capacity=3), "target_capacity"),
])
def test_contract_violations_name_their_field(kwargs, field):
    args = dict(kind=MIXED, batch_capacity=4, token_capacity=1, proposal_depth=0, target_capacity=0,
                prefill_capacity=256) | kwargs
    if field is None:
        GraphShape(**args)
        return
    with pytest.raises(ConfigError) as err:
        GraphShape(**args)
    assert isinstance(err.value, HeliosError) and err.value.field == field


def test_prompt_capacity_is_at_least_the_decode_width():
    # The upper bound on W is the core's (checked in helios.prepare); the shape itself only
    # requires a prompt capacity that a decode-only population also fits.
    with pytest.raises(ConfigError) as err:
        GraphShape(MIXED, 2, 100, 99, 0, 64)
    assert err.value.field == "prefill_capacity"
    assert GraphShape(MIXED, 2, 64, 63, 0, 64).max_packed_extent == 128


def test_other_families_have_no_packed_extent_or_prompt_capacity():
    with pytest.raises(ConfigError):
        GraphShape(GraphKind.DECODE, 4).max_packed_extent
    with pytest.raises(ConfigError):
        GraphShape(GraphKind.PREFILL, 1, 64, prefill_capacity=64)

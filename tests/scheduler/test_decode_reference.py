"""DecodeReference: what planning derives from the measured delivery graphs, once per cost version,
equals the definitions it replaces (docs/scheduling-utility.md)."""

from hypothesis import given, settings, strategies as st

from helios.scheduler.utility import DecodeReference, reference_interval_ms

costs = st.lists(st.tuples(st.sampled_from([1, 2, 3, 4, 8, 16, 32, 64, 128]),
                           st.floats(0.01, 100.0, allow_nan=False)), max_size=12)


@settings(max_examples=300, deadline=None)
@given(costs, st.integers(0, 80))
def test_steps_and_sigma_match_their_definitions(decode_costs, streams):
    ref = DecodeReference(decode_costs)
    # steps[m]: the shortest measured graph with room for m rows; None when none has.
    assert ref.steps == tuple(min((ms for b, ms in decode_costs if b >= m), default=None) for m in range(65))
    assert ref.sigma(streams) == reference_interval_ms(decode_costs, streams, streams)
    assert ref.sigma(streams) == ref.sigma(streams)  # cached, the same value

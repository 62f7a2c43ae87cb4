"""Policy preferences: the spec's defaults table, presets, overrides and validation."""

import math
import pickle
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace

import pytest

from helios.config import BALANCED_ADAPTATION_MS, PolicyConfig, PromptRateLaw, SchedulerConfig, SchedulerPolicy, preset
from helios.errors import ConfigError


def test_defaults_match_the_spec_table():
    p = PolicyConfig()
    assert (p.output_token_value, p.token_fairness, p.delivery_fairness) == (64, 16, 4)
    assert (p.decode_age_price, p.terminal_value, p.terminal_age_price) == (0.1, 256, 1)
    assert (p.adaptation_ms, p.estimate_ttl_ns, p.adaptive_verification_alpha) == (100, 30_000_000_000, 1)


def test_balanced_preset_uses_the_default_coefficients_with_the_measured_adaptation_time():
    # Every preference coefficient is the table's; tau is the study's, and f and g are calibrated
    # to the measured time scale at decision time (docs/scheduling-utility.md, docs/server.md).
    assert preset("balanced") == replace(PolicyConfig(), adaptation_ms=BALANCED_ADAPTATION_MS,
                                         fairness_time_scale=True)
    assert preset("throughput").adaptation_ms == BALANCED_ADAPTATION_MS
    assert preset("throughput").fairness_time_scale
    assert preset("throughput").prompt_rate_law is PromptRateLaw.EWMA
    assert not PolicyConfig().fairness_time_scale and PolicyConfig().served_stall_pricing
    assert PolicyConfig().prompt_rate_law is PromptRateLaw.EWMA  # the table's behaviour: one EWMA throughout


def test_utility_options_are_validated():
    assert PolicyConfig().phase_normalized and PolicyConfig().stall_pricing
    assert PolicyConfig().stall_bound_ms is None and not PolicyConfig().gradient_prompt_price
    for bad in (1, "yes", None):
        with pytest.raises(ConfigError, match="stall_pricing"):
            PolicyConfig(stall_pricing=bad)
    for bad in (0.0, -5.0, math.inf, "300"):
        with pytest.raises(ConfigError, match="stall_bound_ms"):
            PolicyConfig(stall_bound_ms=bad)
    assert PolicyConfig(prompt_rate_law="prompt_phase").prompt_rate_law is PromptRateLaw.PROMPT_PHASE
    for bad in ("mean", 1, None):
        with pytest.raises(ConfigError, match="prompt_rate_law"):
            PolicyConfig(prompt_rate_law=bad)


def test_throughput_preset_drops_delivery_fairness_and_decode_age_only():
    p = preset(SchedulerPolicy.THROUGHPUT)
    assert p.delivery_fairness == 0 and p.decode_age_price == 0
    assert p.token_fairness == 16 and p.output_token_value == 64
    assert p.terminal_value == 256 and p.terminal_age_price == 1


def test_terminal_overrides_apply_after_the_preset():
    p = preset("throughput", terminal_value=0, terminal_age_price=0)
    assert p.terminal_value == 0 and p.terminal_age_price == 0 and p.decode_age_price == 0


@pytest.mark.parametrize("field", ["output_token_value", "token_fairness", "delivery_fairness",
                                   "decode_age_price", "terminal_value", "terminal_age_price"])
@pytest.mark.parametrize("bad", [-1.0, math.inf, math.nan])
def test_values_must_be_finite_and_nonnegative_and_errors_name_the_field(field, bad):
    with pytest.raises(ConfigError, match=field):
        PolicyConfig(**{field: bad})


def test_zero_disables_a_preference_and_is_valid():
    assert PolicyConfig(token_fairness=0, delivery_fairness=0, decode_age_price=0).token_fairness == 0


@pytest.mark.parametrize("bad", [0, -0.5, math.inf])
def test_alpha_must_be_positive(bad):
    with pytest.raises(ConfigError, match="adaptive_verification_alpha"):
        preset("balanced", adaptive_verification_alpha=bad)


def test_unknown_policy_lists_the_choices():
    with pytest.raises(ConfigError, match="balanced, throughput"):
        preset("fastest")


def test_scheduler_config_bounds_selection_to_64_slots_and_two_frames():
    with pytest.raises(ConfigError, match="selection_slots"):
        SchedulerConfig(selection_slots=65)
    with pytest.raises(ConfigError, match="frame_slots"):
        SchedulerConfig(frame_slots=3)
    with pytest.raises(ConfigError, match="request_slots"):
        SchedulerConfig(request_slots=0)


def test_a_config_error_survives_a_process_boundary():
    """A ConfigError raised in a worker (the study and report process pools) reaches the parent with its
    field and message, instead of breaking the pool when it cannot be unpickled."""
    with pytest.raises(ConfigError) as raised:
        PolicyConfig(prompt_rate_law="first_output;stall_bound_ms=350")
    copy = pickle.loads(pickle.dumps(raised.value))
    assert type(copy) is ConfigError
    assert (copy.field, str(copy)) == ("prompt_rate_law", str(raised.value))
    with ProcessPoolExecutor(1) as pool, pytest.raises(ConfigError, match="prompt_rate_law: unknown law"):
        pool.submit(PolicyConfig, prompt_rate_law="nope").result()

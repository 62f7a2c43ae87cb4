"""Policy preferences: the spec's defaults table, presets, overrides and validation."""

import math
import pickle
from concurrent.futures import ProcessPoolExecutor
from dataclasses import fields, replace

import pytest

from helios.config import (
    BALANCED_ADAPTATION_MS, AcceptanceEstimate, PolicyConfig, PromptRateLaw, SchedulerConfig, SchedulerPolicy,
    StudyConfig, preset, study_preset,
)
from helios.errors import ConfigError


def test_the_spec_preset_is_the_spec_table_exactly():
    """`preset("spec")` holds the spec's "Policy preferences" defaults, field for field, and serves
    them with every study switch off (StudyConfig.spec())."""
    p = preset("spec")
    assert (p.output_token_value, p.token_fairness, p.delivery_fairness) == (64, 16, 4)
    assert (p.decode_age_price, p.terminal_value, p.terminal_age_price) == (0.1, 256, 1)
    assert (p.adaptation_ms, p.estimate_ttl_ns, p.adaptive_verification_alpha) == (100, 30_000_000_000, 1)
    assert [f.name for f in fields(PolicyConfig)] == [
        "output_token_value", "token_fairness", "delivery_fairness", "decode_age_price", "terminal_value",
        "terminal_age_price", "adaptation_ms", "estimate_ttl_ns", "adaptive_verification_alpha"]  # the table's rows
    s = study_preset("spec")
    assert s == StudyConfig.spec()
    assert not (s.stall_pricing or s.served_stall_pricing or s.deferred_step_pricing or s.fairness_time_scale)
    assert not s.gradient_prompt_price and s.stall_bound_ms is None and s.prompt_rate_law is PromptRateLaw.EWMA
    assert s.acceptance_estimate is AcceptanceEstimate.SPEC and s.phase_normalized


def test_policy_config_is_the_balanced_preset():
    """PolicyConfig() is what `flare run` serves by default; it differs from the spec's table only in
    the measured adaptation time (docs/scheduling-utility.md, "Deviations from the spec")."""
    assert PolicyConfig() == preset("balanced") == preset()
    assert PolicyConfig().adaptation_ms == BALANCED_ADAPTATION_MS
    assert replace(PolicyConfig(), adaptation_ms=100.0) == preset("spec")
    assert study_preset("balanced") == study_preset("throughput") == StudyConfig()


def test_each_documented_deviation_is_one_switch_away():
    """Every field where the balanced preset departs from the spec is one field of one config."""
    deviations = {(f.name, "policy") for f in fields(PolicyConfig) if getattr(PolicyConfig(), f.name)
                  != getattr(preset("spec"), f.name)}
    deviations |= {(f.name, "study") for f in fields(StudyConfig) if getattr(StudyConfig(), f.name)
                   != getattr(StudyConfig.spec(), f.name)}
    assert deviations == {("adaptation_ms", "policy"), ("stall_pricing", "study"), ("served_stall_pricing", "study"),
                          ("deferred_step_pricing", "study"), ("fairness_time_scale", "study"),
                          ("acceptance_estimate", "study")}
    for name, where in deviations:  # switching it back gives the spec's value
        spec = getattr(preset("spec") if where == "policy" else StudyConfig.spec(), name)
        if where == "policy":
            assert getattr(replace(PolicyConfig(), **{name: spec}), name) == spec
        else:
            assert getattr(replace(StudyConfig(), **{name: spec}), name) == spec


def test_study_switches_are_validated():
    assert StudyConfig().phase_normalized and StudyConfig().stall_pricing
    assert StudyConfig().stall_bound_ms is None and not StudyConfig().gradient_prompt_price
    assert StudyConfig().class_gap_bound is None and StudyConfig.spec().class_gap_bound is None
    for bad in (1, "yes", None):
        with pytest.raises(ConfigError, match="stall_pricing"):
            StudyConfig(stall_pricing=bad)
    for bad in (0.0, -5.0, math.inf, "300"):
        with pytest.raises(ConfigError, match="stall_bound_ms"):
            StudyConfig(stall_bound_ms=bad)
    assert StudyConfig(prompt_rate_law="prompt_phase").prompt_rate_law is PromptRateLaw.PROMPT_PHASE
    for bad in ("mean", 1, None):
        with pytest.raises(ConfigError, match="prompt_rate_law"):
            StudyConfig(prompt_rate_law=bad)
    assert StudyConfig(acceptance_estimate="spec").acceptance_estimate is AcceptanceEstimate.SPEC
    with pytest.raises(ConfigError, match="acceptance_estimate"):
        StudyConfig(acceptance_estimate="geometric")
    for study_field in ("stall_pricing", "stall_bound_ms", "prompt_rate_law"):  # not an operator knob
        with pytest.raises(TypeError):
            PolicyConfig(**{study_field: getattr(StudyConfig(), study_field)})


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
    with pytest.raises(ConfigError, match="balanced, throughput, spec"):
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
        StudyConfig(prompt_rate_law="first_output;stall_bound_ms=350")
    copy = pickle.loads(pickle.dumps(raised.value))
    assert type(copy) is ConfigError
    assert (copy.field, str(copy)) == ("prompt_rate_law", str(raised.value))
    with ProcessPoolExecutor(1) as pool, pytest.raises(ConfigError, match="prompt_rate_law: unknown value"):
        pool.submit(StudyConfig, prompt_rate_law="nope").result()

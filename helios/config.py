"""Policy and scheduler configuration: frozen, validated when built."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from enum import Enum

from helios.errors import ConfigError


class SpeculationMode(Enum):
    """`--speculation`: off, one fixed verification width, or adaptive width selection."""

    OFF = "off"
    FIXED = "fixed"  # host allocation (exact QueryLength): complete prefixes
    ADAPTIVE = "adaptive"  # every width competes; device confidence allocation for D > 0


class AcceptanceEstimate(Enum):
    """How a request's prefix survival s_d is read from its observations (docs/speculation.md).

    SPEC: the spec's per-depth means, each starting at the population prior (0.5^d untrained)
    with weight two; unobserved suffixes keep the prior's means.
    CONDITIONAL (a spec deviation, the default): the product of per-position conditional
    acceptances, each a weighted mean of that position's own evidence and a starting value that
    follows the request's measured per-position rate (pooled over the positions it reached), so a
    request that accepts at rate q at the depths it has shown assumes about q per deeper position.
    """

    SPEC = "spec"
    CONDITIONAL = "conditional"


class PromptRateLaw(Enum):
    """How a request's token rate x moves before it has output (docs/scheduling-utility.md §6).

    EWMA (the table's behaviour and the presets'): the one EWMA from admission; a waiting prompt's
    price grows as e^(W/tau). PROMPT_PHASE (an option): until its first output token a request's rate
    is its mean progress toward that token since admission, its starting rate counting as one
    adaptation time and a prompt of P tokens as one output token, x = (x0 tau + p/P) / (tau + W): a
    waiting prompt's price grows linearly, and a partly prefilled one keeps its place; then the EWMA
    continues from the same rate. FIRST_OUTPUT (an option): the same mean, counting what the user has
    received, output tokens only, x = (x0 tau + o) / (tau + W): a chunk does not lower a prompt's price,
    so older prompts keep outranking younger ones through their whole prefill. OUTPUT_EWMA (an option):
    the table's EWMA, counting output tokens only, so a chunk does not lower a prompt's price either,
    and a waiting prompt's price grows as e^(W/tau) from admission until its first token. UNTIL_SERVED
    (ablation): the PROMPT_PHASE mean only until the first service.
    Why none is the presets' default: docs/scheduling-utility.md §6 (better SLO goodput on the
    simulated traces with mixed graphs; far later first tokens for a burst of prompts on the CPU server,
    where a prefill graph stalls the decoders for 10-20 tau and a linearly growing price cannot outbid
    that stall's e^(T/tau)).
    """

    EWMA = "ewma"
    UNTIL_SERVED = "until_served"
    PROMPT_PHASE = "prompt_phase"
    FIRST_OUTPUT = "first_output"
    OUTPUT_EWMA = "output_ewma"

    @property
    def mean_law(self) -> bool:
        """Whether a request without output follows the mean rate rather than the EWMA."""
        return self in (PromptRateLaw.UNTIL_SERVED, PromptRateLaw.PROMPT_PHASE, PromptRateLaw.FIRST_OUTPUT)

    @property
    def credits_prompt(self) -> bool:
        """Whether consumed prompt tokens count as service in x (not on the laws that count only
        what the user has received)."""
        return self not in (PromptRateLaw.FIRST_OUTPUT, PromptRateLaw.OUTPUT_EWMA)


class PreemptionPolicy(Enum):
    """`--preemption`: whether the scheduler retires resident decoders on its own (preemption.py).

    OFF: only an explicit `Scheduler.preempt` retires one (the baselines and the simulator's presets).
    PRICE: a ready request that cannot start for want of a slot or pages, and whose fairness price
    grew `price_ratio` times above a resident decoder's, has that decoder retired through a
    snapshot; the victim resumes later by restore with the same tokens.
    """

    OFF = "off"
    PRICE = "price"


@dataclass(frozen=True, slots=True)
class PreemptionConfig:
    """The automatic preemption policy's knobs (docs/prefix-reuse.md, "Automatic preemption").

    price_ratio   the waiter's fairness price f/x must be at least this many times the victim's
                  (>= 1): a newcomer starts at the live requests' mean rate and its price grows by
                  e^(W/tau) while it waits, so 4 is about tau * ln 4 (69 ms at tau = 50 ms) of waiting
    quantum_ms    a request is never preempted before it has held its slot this long since it was
                  (re)admitted to one: every residency makes progress, nothing thrashes
    max_retiring  preemptions whose snapshot has not completed yet, at most (a burst of arrivals
                  does not retire the whole batch at once)
    """

    policy: PreemptionPolicy = PreemptionPolicy.OFF
    price_ratio: float = 4.0
    quantum_ms: float = 500.0
    max_retiring: int = 1

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "policy", PreemptionPolicy(self.policy))  # the Enum or its value
        except ValueError:
            names = ", ".join(p.value for p in PreemptionPolicy)
            raise ConfigError("preemption", f"unknown policy {self.policy!r} (choose {names})") from None
        for name, low in (("price_ratio", 1.0), ("quantum_ms", 0.0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or value < low:
                raise ConfigError(f"preemption_{name}", f"must be a finite number >= {low:g}, got {value!r}")
        if isinstance(self.max_retiring, bool) or not isinstance(self.max_retiring, int) or self.max_retiring < 1:
            raise ConfigError("preemption_max_retiring", f"must be a positive integer, got {self.max_retiring!r}")

    @property
    def enabled(self) -> bool:
        return self.policy is not PreemptionPolicy.OFF


class SchedulerPolicy(Enum):
    """`--scheduler-policy`: the spec's presets, and `spec`, which reproduces its table exactly.

    BALANCED: the table with the measured deviations of docs/scheduling-utility.md ("Deviations
    from the spec"): tau = 50 ms, time-scaled prices, priced stalls and the deferred step.
    THROUGHPUT: BALANCED without delivery fairness and output-age price (the spec's throughput preset).
    SPEC: the spec's table as written, with every study switch off (StudyConfig.spec()).
    """

    BALANCED = "balanced"
    THROUGHPUT = "throughput"
    SPEC = "spec"


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    """What an operator chooses: the spec's preference coefficients ("Policy preferences"), in
    value units per ms. `PolicyConfig()` is the balanced preset; `preset("spec")` is the spec's table."""

    output_token_value: float = 64.0
    token_fairness: float = 16.0
    delivery_fairness: float = 4.0
    decode_age_price: float = 0.1
    terminal_value: float = 256.0
    terminal_age_price: float = 1.0
    # The table's 100 ms assumes graphs of a few ms; 50 ms was measured for graphs of tens to
    # hundreds of ms (docs/scheduling-utility.md section 5); preset("spec") keeps 100.
    adaptation_ms: float = 50.0
    estimate_ttl_ns: int = 30_000_000_000
    adaptive_verification_alpha: float = 1.0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ConfigError(f.name, f"must be a number, got {value!r}")
            if not math.isfinite(value) or value < 0:
                raise ConfigError(f.name, f"must be finite and nonnegative, got {value!r}")
        if self.adaptive_verification_alpha <= 0:
            raise ConfigError("adaptive_verification_alpha", "must be greater than zero")
        if self.adaptation_ms <= 0:
            raise ConfigError("adaptation_ms", "must be greater than zero")
        if self.estimate_ttl_ns <= 0 or int(self.estimate_ttl_ns) != self.estimate_ttl_ns:
            raise ConfigError("estimate_ttl_ns", "must be a positive whole number of nanoseconds")


_STUDY_FLAGS = ("phase_normalized", "stall_pricing", "served_stall_pricing", "deferred_step_pricing",
                "gradient_prompt_price", "fairness_time_scale")


@dataclass(frozen=True, slots=True)
class StudyConfig:
    """Study and ablation switches beyond the spec's table, apart from what an operator chooses.

    `flare run` does not expose them; `flare sim` sets them by name with
    `--scheduler 'helios-balanced[key=value]'`. `StudyConfig()` is what the balanced and throughput
    presets serve; `StudyConfig.spec()` is the spec as written. docs/scheduling-utility.md
    ("Deviations from the spec") gives each switch's measured reason.
    """

    # Service rates normalized by the measured reference rate of the request's current phase
    # (the spec's "token and delivery normalizers"; False: physical tokens/ms, the pre-issue-12 rates).
    phase_normalized: bool = True
    # Price an excluded decoder's stall by the growth of its own fairness and delivery prices over
    # the candidate's duration, e^(T/tau) - 1, as a waiting prompt's price grows.
    stall_pricing: bool = True
    # With stall_pricing, also charge the decoders a mixed graph serves but delays: for the excess
    # of T over the fastest decode step with room for them, they are stalled, and owe that growth.
    served_stall_pricing: bool = True
    # Score a prefill, mixed, decode or speculative graph that leaves active decoders out as the
    # sequence with the fastest step that serves them: their token is deferred, not free (the
    # machine time it will still cost counts against the candidate). Prefill graphs use it only
    # when mixed graphs are loaded (docs/scheduling-utility.md section 4).
    deferred_step_pricing: bool = True
    # False: the spec's prices, one f/x for prompt and output tokens (x in decode-reference units).
    # True: prompt tokens at the exact gradient of f log x, f/x * r_decode/r_prefill (~0.004 f/x
    # here): fairer in machine shares, slower first tokens (docs/scheduling-utility.md, ablation).
    gradient_prompt_price: bool = False
    # Calibrate f and g to the measured time scale: scale both down (never up) so that a stream at
    # the reference decode rate r_d has a fairness price f/x of at most beta. The table's f = 16
    # and beta = 64 balance at x = 0.25 tokens/ms, a 4-ms decode step; on a 40-ms step f/x is
    # 10 beta and every token, prompt or output, is priced alike (docs/scheduling-utility.md section 9).
    fairness_time_scale: bool = True
    # How x moves before a request has history (PromptRateLaw): the table's EWMA, or a mean over the
    # wait, so that a queue of prompts cannot price every decoder out by e^(W/tau).
    prompt_rate_law: PromptRateLaw = PromptRateLaw.EWMA
    # Outside the spec (which rules duration ceilings out): drop a prefill candidate when the
    # oldest decoder's age + T + one decode step would exceed this many ms. None: off.
    stall_bound_ms: float | None = None
    # Outside the spec, likewise: the same drop, with each decoder's own bound this fraction of the gap
    # target its service class states (docs/scheduling-utility.md, "The class gap bound"); decoders of
    # classes that state none keep stall_bound_ms (or no bound). None: off.
    class_gap_bound: float | None = None
    # How acceptance estimates read their observations; CONDITIONAL departs from the spec's
    # untrained 0.5^d and "unobserved suffixes retain their means" (docs/speculation.md).
    acceptance_estimate: AcceptanceEstimate = AcceptanceEstimate.CONDITIONAL

    def __post_init__(self) -> None:
        for name in _STUDY_FLAGS:
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(name, f"must be a bool, got {getattr(self, name)!r}")
        for name, enum in (("prompt_rate_law", PromptRateLaw), ("acceptance_estimate", AcceptanceEstimate)):
            try:
                object.__setattr__(self, name, enum(getattr(self, name)))  # the Enum or its value
            except ValueError:
                names = ", ".join(e.value for e in enum)
                raise ConfigError(name, f"unknown value {getattr(self, name)!r} (choose {names})") from None
        bound = self.stall_bound_ms
        if bound is not None and (isinstance(bound, bool) or not isinstance(bound, (int, float))
                                  or not math.isfinite(bound) or bound <= 0):
            raise ConfigError("stall_bound_ms", f"must be positive, or None to disable the bound, got {bound!r}")
        share = self.class_gap_bound
        if share is not None and (isinstance(share, bool) or not isinstance(share, (int, float))
                                  or not 0 < share <= 1):
            raise ConfigError("class_gap_bound", f"must be a fraction in (0, 1] of the class's gap target, or None "
                                                 f"to disable it, got {share!r}")

    @staticmethod
    def spec() -> "StudyConfig":
        """The spec as written: no stall or deferred-step pricing, the table's f and g, the spec's
        per-depth acceptance means. Phase normalizers stay: they are the spec's normalizers."""
        return StudyConfig(stall_pricing=False, served_stall_pricing=False, deferred_step_pricing=False,
                           fairness_time_scale=False, acceptance_estimate=AcceptanceEstimate.SPEC)


# The study of issue 12 (docs/results/h100-70b/report.md, ablation): with priced stalls, 50 ms beat
# the table's 100 ms (and 25 and 300 ms) on both traces.
BALANCED_ADAPTATION_MS = 50.0
SPEC_ADAPTATION_MS = 100.0  # the spec's table


def _policy_name(policy: SchedulerPolicy | str) -> SchedulerPolicy:
    try:
        return SchedulerPolicy(policy)
    except ValueError:
        names = ", ".join(p.value for p in SchedulerPolicy)
        raise ConfigError("scheduler_policy", f"unknown policy {policy!r} (choose {names})") from None


def preset(
    policy: SchedulerPolicy | str = SchedulerPolicy.BALANCED,
    *,
    terminal_value: float | None = None,
    terminal_age_price: float | None = None,
    adaptive_verification_alpha: float | None = None,
) -> PolicyConfig:
    """Build a preset's coefficients; the terminal overrides apply after the preset, as the spec
    requires. Its study switches are `study_preset(policy)`."""
    policy = _policy_name(policy)
    config = PolicyConfig()  # balanced
    if policy is SchedulerPolicy.THROUGHPUT:
        # Throughput keeps token fairness and output value, drops cadence preferences.
        config = replace(config, delivery_fairness=0.0, decode_age_price=0.0)
    elif policy is SchedulerPolicy.SPEC:
        config = replace(config, adaptation_ms=SPEC_ADAPTATION_MS)
    overrides = {
        "terminal_value": terminal_value,
        "terminal_age_price": terminal_age_price,
        "adaptive_verification_alpha": adaptive_verification_alpha,
    }
    return replace(config, **{k: v for k, v in overrides.items() if v is not None})


def study_preset(policy: SchedulerPolicy | str = SchedulerPolicy.BALANCED) -> StudyConfig:
    """A preset's study switches: the spec's for `spec`, the measured deviations otherwise."""
    return StudyConfig.spec() if _policy_name(policy) is SchedulerPolicy.SPEC else StudyConfig()


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """Resources and bounds of one scheduler instance (not preferences)."""

    request_slots: int = 64
    kv_pages: int = 4096
    page_tokens: int = 16
    max_context: int = 8192
    selection_slots: int = 64  # the spec's bound on slots considered per decision
    frame_slots: int = 2  # transport frames; only decode may occupy both
    draft_capacity: int = 8  # deepest proposal depth tracked (confidence sidecar width)
    speculation: SpeculationMode = SpeculationMode.OFF
    copy_proposals: bool = False  # prompt lookup instead of a learned proposer
    # Funded timing refresh and acceptance learning; False keeps both ledgers from ever earning
    # (the counterfactual in which a first estimate lasts forever, for experiments).
    funded_exploration: bool = True
    # The spec's scheduler_checkpoint_extra_work_fraction: extra prefill splits and snapshot
    # copies fit this share of a request's estimated uncached prefill work, and productive
    # decode earns the same share of its measured time for a terminal capture.
    checkpoint_extra_work_fraction: float = 0.05
    # Private snapshot rows for vision windows: a request whose images span several windows
    # reserves one from its first vision graph until its last window is restored (vision.py).
    window_snapshot_rows: int = 64
    # Automatic preemption (off unless asked for; `flare run` turns it on where the catalog has
    # snapshot and restore graphs). Without them, or with a baseline, it never acts.
    preemption: PreemptionConfig = PreemptionConfig()
    # A client's share of the running slots (scheduler/slot_share.py): off unless asked for;
    # `flare run --slot-share fair` (its default) turns it on for the Helios scheduler.
    slot_share: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.speculation, SpeculationMode):
            try:
                object.__setattr__(self, "speculation", SpeculationMode(self.speculation))
            except ValueError:
                raise ConfigError("speculation", f"choose off, fixed or adaptive, got {self.speculation!r}") from None
        for name in ("copy_proposals", "funded_exploration", "slot_share"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(name, "must be a bool")
        if not isinstance(self.preemption, PreemptionConfig):
            raise ConfigError("preemption", f"must be a PreemptionConfig, got {self.preemption!r}")
        for f in fields(self):
            if f.name in ("speculation", "copy_proposals", "funded_exploration", "checkpoint_extra_work_fraction",
                          "preemption", "slot_share"):
                continue
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f.name, f"must be a positive integer, got {value!r}")
        fraction = self.checkpoint_extra_work_fraction
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0.0 <= fraction < 1.0:
            raise ConfigError("checkpoint_extra_work_fraction", f"must be a number in [0, 1), got {fraction!r}")
        if self.selection_slots > 64:
            raise ConfigError("selection_slots", "the spec bounds selection to 64 request slots")
        if self.frame_slots > 2:
            raise ConfigError("frame_slots", "the transport has two frame slots")

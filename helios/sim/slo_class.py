"""Single class, targets known: Helios told the report's SLO (issue 40).

`flare sim report --schedulers 'helios-balanced[default_class=slo]'` runs Helios with a class table
whose default class carries the workload's SLO as its targets: the first-token target is the SLO's
TTFT and the gap target its p99 gap. Every request is still in the one (default) class, so what
changes is only the scale of its prices (class_prices.py): the adaptation times of the prompt and
stream phases come from the targets instead of the policy's fixed 50 ms, and the prompt phase counts
only output as service. The baselines are class-blind and take no such variant.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from helios.errors import ConfigError
from helios.scheduler.service_class import ClassTable, ServiceClass
from helios.sim.metrics import SLO

DEFAULT_CLASS_KEY = "default_class"  # the variant key: helios-balanced[default_class=slo]
DEFAULT_CLASS_CHOICES = ("slo",)
SLO_CLASS_NAME = "slo"


def check_default_class(value: str, name: str) -> str:
    """The value of a `default_class=` variant, or a ConfigError naming the choices."""
    if value not in DEFAULT_CLASS_CHOICES:
        raise ConfigError("scheduler", f"bad variant default_class={value!r} in {name!r}: choose from "
                                       f"{', '.join(DEFAULT_CLASS_CHOICES)} (the report's SLO as the default "
                                       f"class's targets)")
    return value


def slo_table(slo: SLO) -> ClassTable:
    """A class table with one class, the default, whose targets are the SLO's (TTFT, p99 gap)."""
    cls = ServiceClass(SLO_CLASS_NAME, ttft_ms=slo.ttft_ms, gap_ms=slo.gap_ms)
    return ClassTable({SLO_CLASS_NAME: cls}, default=SLO_CLASS_NAME)


def with_default_class(arrivals: Sequence, table: ClassTable) -> list:
    """`arrivals` with every request in the table's default class (they name none)."""
    cls = table.service_class(None)
    return [replace(a, spec=replace(a.spec, service_class=cls)) for a in arrivals]

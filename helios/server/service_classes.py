"""Service classes on the API (issue 40; docs/server.md, "Service classes and tenants").

A request's class comes from one field, chosen by `flare run --class-field`:

- `service_tier` (default): OpenAI's field names the class. Absent, `auto` or `default` means the tenant's
  class, else the table's default. OpenAI's `flex` and `priority` tiers mean `batch` and `interactive`
  unless the table defines classes of those names.
- `priority`: vLLM's integer (lower is more urgent) picks the most urgent class whose tier it reaches
  (`ClassTable.by_priority`); absent means the tenant's class, else the default.
- `user`: the tenant's class in the table (`[tenants.NAME] class = ...`), else the default.

The tenant is always `user` (its weight from the table), and an explicit `priority` is kept on the request
for priority-queue schedulers. An unknown class name is a 400 naming the field.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from helios.errors import ConfigError
from helios.scheduler.service_class import BUILTIN_TABLE, ClassTable, ServiceClass
from helios.server.errors import APIError

CLASS_FIELDS = ("service_tier", "priority", "user")
_TIER_ALIASES = {"flex": "batch", "priority": "interactive"}  # OpenAI's tiers, when the table lacks them


@dataclass(frozen=True)
class ClassPolicy:
    """The class table and the request field that selects a class."""

    table: ClassTable = field(default_factory=lambda: BUILTIN_TABLE)
    field: str = "service_tier"

    def __post_init__(self) -> None:
        if self.field not in CLASS_FIELDS:
            raise ConfigError("class_field", f"must be one of {', '.join(CLASS_FIELDS)}, got {self.field!r}")


def request_class(req, policy: ClassPolicy) -> dict:
    """The SamplingParams fields of a request's class and tenant: service_class, tenant_weight, priority."""
    table, user = policy.table, req.user
    priority = getattr(req, "priority", None)
    name = None
    if policy.field == "service_tier" and req.service_tier not in (None, "auto", "default"):
        name = req.service_tier
        if name not in table.classes and _TIER_ALIASES.get(name) in table.classes:
            name = _TIER_ALIASES[name]
    try:
        if policy.field == "priority" and priority is not None:
            cls: ServiceClass = table.by_priority(priority)
        else:
            cls = table.service_class(name, user)
    except ConfigError as exc:
        raise APIError(400, f"{policy.field}: {exc.message}", param=policy.field, code="invalid_value") from None
    return {"service_class": cls, "tenant_weight": table.tenant_weight(user), "priority": priority}


def with_class(prepared, fields: dict):
    """`prepared` (translate.Prepared) with the class fields on every choice's SamplingParams."""
    choices = tuple(dataclasses.replace(c, params=dataclasses.replace(c.params, **fields)) for c in prepared.choices)
    return dataclasses.replace(prepared, choices=choices)

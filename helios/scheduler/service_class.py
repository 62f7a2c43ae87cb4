"""Service classes and tenants: what a request is worth and whom it is served for (issue 40).

A service class is a named set of targets: a first-token target (a fixed part plus a part per
prompt token), a streaming (gap) target, an optional completion deadline, a weight, and a vLLM
priority tier (lower is more urgent) for the baselines and clients that speak priorities. A tenant is
who pays (`RequestSpec.client` names it); its weight shares the machine between tenants.

The `default` class has no targets and weight one: a request in it is priced exactly as before
classes existed (docs/scheduling-utility.md, "Service classes and tenants"). The built-in
`interactive`, `standard` and `batch` classes are starting points for an H100-class 70B server;
an operator's table (`helios.class_table.load_class_table`, TOML or JSON) replaces or adds to them.

Everything here is pure: a table is built from an already-parsed mapping, and every error names the
source and the field.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

from helios.errors import ConfigError

DEFAULT_CLASS_NAME = "default"
DEFAULT_TENANT = "default"
_TARGETS = ("ttft_ms", "ttft_per_token_ms", "gap_ms", "deadline_ms")


def _positive(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value) and value > 0


@dataclass(frozen=True, slots=True)
class ServiceClass:
    """A class's targets (milliseconds; None: no target) and weights.

    The first-token target of a P-token prompt is `ttft_ms + ttft_per_token_ms * P` (either part may be
    absent); `gap_ms` bounds the time between visible outputs; `deadline_ms` the whole response.
    `weight` scales the class's fairness in the utility (positive: no class starves); `priority` is
    vLLM's integer (lower is more urgent), used by priority-queue baselines and the server's mapping.
    """

    name: str
    ttft_ms: float | None = None
    ttft_per_token_ms: float | None = None
    gap_ms: float | None = None
    deadline_ms: float | None = None
    weight: float = 1.0
    priority: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ConfigError("name", f"a service class needs a nonempty name, got {self.name!r}")
        for key in _TARGETS:
            value = getattr(self, key)
            if value is not None and not _positive(value):
                raise ConfigError(key, f"class {self.name!r}: must be a positive number of ms or absent, "
                                       f"got {value!r}")
            if value is not None:
                object.__setattr__(self, key, float(value))
        if not _positive(self.weight):
            raise ConfigError("weight", f"class {self.name!r}: must be a positive number (a zero weight would "
                                        f"let the class starve), got {self.weight!r}")
        object.__setattr__(self, "weight", float(self.weight))
        if isinstance(self.priority, bool) or not isinstance(self.priority, int):
            raise ConfigError("priority", f"class {self.name!r}: must be an integer, got {self.priority!r}")

    @property
    def has_targets(self) -> bool:
        return any(getattr(self, key) is not None for key in _TARGETS)

    def first_token_target_ms(self, prompt_tokens: int) -> float | None:
        """The first-token target of a `prompt_tokens`-token prompt, or None without one."""
        if self.ttft_ms is None and self.ttft_per_token_ms is None:
            return None
        return (self.ttft_ms or 0.0) + (self.ttft_per_token_ms or 0.0) * prompt_tokens


@dataclass(frozen=True, slots=True)
class Tenant:
    """Who pays: a name and a weight (its share of the machine against other backlogged tenants), and
    the class its requests get when they name none (None: the table's default)."""

    name: str
    weight: float = 1.0
    service_class: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError("name", f"a tenant needs a nonempty name, got {self.name!r}")
        if not _positive(self.weight):
            raise ConfigError("weight", f"tenant {self.name!r}: must be a positive number, got {self.weight!r}")
        object.__setattr__(self, "weight", float(self.weight))
        if self.service_class is not None and not isinstance(self.service_class, str):
            raise ConfigError("class", f"tenant {self.name!r}: must be a class name, got {self.service_class!r}")


DEFAULT_CLASS = ServiceClass(DEFAULT_CLASS_NAME)
# Built-in starting points (an H100-class 70B server): chat, ordinary API traffic, offline batch.
BUILTIN_CLASSES = (
    DEFAULT_CLASS,
    ServiceClass("interactive", ttft_ms=1000.0, gap_ms=100.0, weight=4.0, priority=0),
    ServiceClass("standard", ttft_ms=3000.0, gap_ms=250.0, weight=1.0, priority=1),
    ServiceClass("batch", deadline_ms=600_000.0, weight=0.25, priority=2),
)


@dataclass(frozen=True)
class ClassTable:
    """Classes and tenants by name, and the class a request gets when it names none."""

    classes: Mapping[str, ServiceClass] = field(
        default_factory=lambda: MappingProxyType({c.name: c for c in BUILTIN_CLASSES}))
    tenants: Mapping[str, Tenant] = field(default_factory=lambda: MappingProxyType({}))
    default: str = DEFAULT_CLASS_NAME

    def __post_init__(self) -> None:
        for name, c in self.classes.items():
            if not isinstance(c, ServiceClass) or c.name != name:
                raise ConfigError("classes", f"entry {name!r} must be the ServiceClass named {name!r}")
        if self.default not in self.classes:
            raise ConfigError("default", f"unknown class {self.default!r}; classes: {', '.join(self.classes)}")
        for name, t in self.tenants.items():
            if not isinstance(t, Tenant) or t.name != name:
                raise ConfigError("tenants", f"entry {name!r} must be the Tenant named {name!r}")
            if t.service_class is not None and t.service_class not in self.classes:
                raise ConfigError("tenants", f"tenant {name!r} names unknown class {t.service_class!r}; "
                                             f"classes: {', '.join(self.classes)}")
        object.__setattr__(self, "classes", MappingProxyType(dict(self.classes)))
        object.__setattr__(self, "tenants", MappingProxyType(dict(self.tenants)))

    def service_class(self, name: str | None, tenant: str | None = None) -> ServiceClass:
        """The class a request gets: the one it names, else its tenant's, else the default. An unknown
        name raises ConfigError (field "service_class") listing the known ones."""
        if name is None and tenant is not None and tenant in self.tenants:
            name = self.tenants[tenant].service_class
        if name is None:
            return self.classes[self.default]
        found = self.classes.get(name)
        if found is None:
            raise ConfigError("service_class", f"unknown class {name!r}; classes: {', '.join(self.classes)}")
        return found

    def by_priority(self, priority: int) -> ServiceClass:
        """The class for a vLLM `priority` integer: the most urgent class whose tier is at least as
        urgent as asked (priority <= the class's), else the least urgent class."""
        ranked = sorted(self.classes.values(), key=lambda c: (c.priority, c.name))
        return next((c for c in ranked if priority <= c.priority), ranked[-1])

    def tenant_weight(self, tenant: str | None) -> float:
        """A tenant's weight; a tenant the table does not name has weight one."""
        found = self.tenants.get(tenant) if tenant is not None else None
        return 1.0 if found is None else found.weight


BUILTIN_TABLE = ClassTable()

_CLASS_KEYS = {"ttft_ms", "ttft_per_token_ms", "gap_ms", "deadline_ms", "weight", "priority"}
_TENANT_KEYS = {"weight", "class"}


def table_from_mapping(data: Any, source: str = "class table", builtins: bool = True) -> ClassTable:
    """A ClassTable from parsed TOML/JSON: `{"default": NAME, "classes": {NAME: {...}}, "tenants":
    {NAME: {"weight": W, "class": NAME}}}`. With `builtins` the built-in classes are kept unless the
    table redefines them. Every error is a ConfigError whose field is `SOURCE: classes.NAME.KEY`."""
    if not isinstance(data, Mapping):
        raise ConfigError(source, f"must be a table/object at the top level, got {type(data).__name__}")
    unknown = set(data) - {"default", "classes", "tenants"}
    if unknown:
        raise ConfigError(f"{source}: {sorted(unknown)[0]}", "unknown key; expected default, classes, tenants")
    classes = {c.name: c for c in BUILTIN_CLASSES} if builtins else {}
    classes.update(_entries(data, "classes", source, _CLASS_KEYS, lambda name, body: ServiceClass(name, **body)))
    tenants = _entries(data, "tenants", source, _TENANT_KEYS,
                       lambda name, body: Tenant(name, body.get("weight", 1.0), body.get("class")))
    default = data.get("default", DEFAULT_CLASS_NAME)
    try:
        return ClassTable(classes, tenants, default)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc.field}", exc.message) from None


def _entries(data: Mapping, section: str, source: str, keys: set[str], build) -> dict:
    """`build(name, body)` for every entry of `data[section]`, with errors named `SOURCE: section.NAME.KEY`."""
    raw = data.get(section, {})
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{source}: {section}", f"must be a table of {section} by name")
    out = {}
    for name, body in raw.items():
        where = f"{source}: {section}.{name}"
        if not isinstance(body, Mapping):
            raise ConfigError(where, f"must be a table with {', '.join(sorted(keys))}")
        bad = set(body) - keys
        if bad:
            raise ConfigError(f"{where}.{sorted(bad)[0]}", f"unknown key; expected {', '.join(sorted(keys))}")
        try:
            out[name] = build(name, body)
        except ConfigError as exc:
            raise ConfigError(f"{where}.{exc.field}", exc.message.split(": ", 1)[-1]) from None
    return out

"""Load a service-class table from a TOML or JSON file (`flare run --service-classes PATH`).

The file's format is `helios.scheduler.service_class.table_from_mapping`'s; docs/server.md has an
example. TOML is chosen by a `.toml` suffix, JSON otherwise. Every error is a ConfigError whose field
starts with the file's path, so the message says which file and which field is wrong.
"""

from __future__ import annotations

import json
import os
import tomllib

from helios.errors import ConfigError
from helios.scheduler.service_class import ClassTable, table_from_mapping


def load_class_table(path: str | os.PathLike[str], builtins: bool = True) -> ClassTable:
    """The classes and tenants of `path` (with the built-in classes unless `builtins` is False)."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except OSError as exc:
        raise ConfigError(path, f"cannot read the class table: {exc.strerror or exc}") from None
    try:
        if path.endswith(".toml"):
            data = tomllib.loads(raw.decode("utf-8"))
        else:
            data = json.loads(raw)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        kind = "TOML" if path.endswith(".toml") else "JSON"
        raise ConfigError(path, f"not valid {kind}: {exc}") from None
    return table_from_mapping(data, path, builtins)

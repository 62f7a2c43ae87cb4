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


def read_toml_or_json(path: str | os.PathLike[str], what: str):
    """The parsed contents of a TOML (by a `.toml` suffix) or JSON file; a ConfigError whose field is the
    path says when it cannot be read or parsed (`what` names the file's role in the message)."""
    path = os.fspath(path)
    kind = "TOML" if path.endswith(".toml") else "JSON"
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
        return tomllib.loads(raw.decode("utf-8")) if kind == "TOML" else json.loads(raw)
    except OSError as exc:
        raise ConfigError(path, f"cannot read the {what}: {exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(path, f"not valid {kind}: {exc}") from None


def load_class_table(path: str | os.PathLike[str], builtins: bool = True) -> ClassTable:
    """The classes and tenants of `path` (with the built-in classes unless `builtins` is False)."""
    return table_from_mapping(read_toml_or_json(path, "class table"), os.fspath(path), builtins)

"""Where in a JSON schema an output constraint failed (issue 42): the deepest subschema that fails
on its own (the field path of the schema itself: structured_outputs.constraint_source).

The probe (constraint_limits.py) compiles a whole grammar and walks a few tokens; llguidance's
reasons name neither the request field nor the schema position. So when a schema fails, its
subschemas are tried alone, depth first (properties, patternProperties, the entries of
anyOf/oneOf/allOf/prefixItems, items, additionalProperties, not, if/then/else, contains, and last
$defs and definitions, which fail through the places that use them), each with the root's `$defs`
and `definitions` so that its references still resolve. The walk descends into the first one that
fails the same check and stops where none does; the path then reads like
`response_format.json_schema.schema.properties.x` (list entries as `anyOf[3]`). At most `attempts`
subschemas are compiled, so a wide schema costs a bounded time. A subschema can also fail alone for
a reason of its own (a reference to a position outside the definitions); then it is named instead.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

MAPS = ("properties", "patternProperties", "$defs", "definitions")  # name -> subschema
_DEFS = MAPS[2:]
LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
ONE = ("items", "additionalProperties", "not", "if", "then", "else", "contains")


def _children(schema: dict) -> Iterator[tuple[str, object]]:
    # Definitions last: they fail through the places that use them, which say more.
    for key in ("properties", "patternProperties"):
        if isinstance(schema.get(key), dict):
            yield from ((f".{key}.{name}", sub) for name, sub in schema[key].items())
    for key in LISTS:
        if isinstance(schema.get(key), list):
            yield from ((f".{key}[{i}]", sub) for i, sub in enumerate(schema[key]))
    for key in ONE:
        sub = schema.get(key)
        if isinstance(sub, list):
            yield from ((f".{key}[{i}]", s) for i, s in enumerate(sub))
        elif sub is not None:
            yield f".{key}", sub
    for key in _DEFS:
        if isinstance(schema.get(key), dict):
            yield from ((f".{key}.{name}", sub) for name, sub in schema[key].items())


def deepest_failing(schema: dict, path: str, fails: Callable[[dict], bool], attempts: int = 32) -> str:
    """The path of the deepest subschema of `schema` (itself failing, at `path`) that `fails` alone."""
    defs = {k: schema[k] for k in _DEFS if isinstance(schema.get(k), dict)}
    node, tried = schema, 0
    while True:
        for suffix, sub in _children(node):
            if not isinstance(sub, dict) or tried >= attempts:
                continue
            tried += 1
            if fails({**defs, **sub}):
                node, path = sub, path + suffix
                break
        else:
            return path

"""OpenAI's `response_format` (chat, and completions as in vLLM): `text`, `json_object` (any JSON object) or
`json_schema` (JSON matching the given schema), turned into the core's grammar option
(helios.engine.grammar), with a 400 naming what is wrong."""

from __future__ import annotations

import functools
import json

from helios.engine.grammar import json_schema_grammar, text_grammar
from helios.errors import InvalidRequest
from helios.server.constraint_limits import check_source, timed
from helios.server.errors import APIError

PARAM = "response_format"


def response_grammar(response_format: dict | None) -> str | None:
    """The grammar a response format asks for; None for plain text."""
    if response_format is None:
        return None
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return compiled_grammar("json", None, PARAM)
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, dict):
            raise APIError(400, "response_format json_schema needs a json_schema object with the schema under "
                                "\"schema\"", param=f"{PARAM}.json_schema", code="invalid_value")
        schema = spec.get("schema")
        if schema is not None and not isinstance(schema, dict):
            raise APIError(400, "response_format.json_schema.schema must be a JSON object",
                           param=f"{PARAM}.json_schema.schema", code="invalid_value")
        return compiled_grammar("json", schema, f"{PARAM}.json_schema.schema")
    raise APIError(400, f"response_format.type must be \"text\", \"json_object\" or \"json_schema\", got {kind!r}",
                   param=f"{PARAM}.type", code="invalid_value")


def compiled_grammar(kind: str, source, param: str, whitespace_pattern: str | None = None) -> str:
    """The grammar of `source` read as `kind`: "json" (a JSON schema; None: any object, laid out
    with `whitespace_pattern` when given), "regex", "choice" (a list of strings) or "grammar" (Lark
    or GBNF). A 400 naming `param` if it cannot compile."""
    if source is not None:
        check_source(kind, source, param)  # size budgets first: nothing oversized reaches the compiler
    try:
        return timed(_compiled, kind, json.dumps(source, sort_keys=True), whitespace_pattern, param=param)
    except InvalidRequest as exc:
        raise APIError(400, str(exc)[:300], param=param, code="invalid_value") from None


@functools.lru_cache(maxsize=256)
def _compiled(kind: str, source_json: str, whitespace_pattern: str | None) -> str:
    # Clients tend to send one constraint with every request (and a batch of completion prompts
    # shares one), so each distinct one is compiled once.
    source = json.loads(source_json)
    if kind == "json":
        return json_schema_grammar(source, whitespace_pattern)
    return text_grammar(kind, source)

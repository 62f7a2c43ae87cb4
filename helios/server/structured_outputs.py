"""vLLM's structured outputs on both endpoints: the `structured_outputs` object (json, regex, choice,
grammar or json_object, with its options) and the `guided_*` fields that vLLM 0.12 removed but many
clients still send. Each becomes the core's grammar option, as `response_format` does; a request
names at most one constraint, and anything malformed is a 400 naming the field."""

from __future__ import annotations

import json

from helios.server.constraint_paths import LISTS as _LISTS, MAPS as _MAPS, ONE as _ONE
from helios.server.errors import APIError
from helios.server.response_format import compiled_grammar, response_grammar
from helios.server.schemas import StructuredOutputs

PARAM = "structured_outputs"
LEGACY = ("guided_json", "guided_regex", "guided_choice", "guided_grammar")
KINDS = ("json", "regex", "choice", "grammar", "json_object")


def grammar_param(req) -> str | None:
    """The field that constrains this request's output (None: free text); a 400 if several do."""
    fmt = req.response_format
    asked = [name for name, on in (("response_format", fmt is not None and fmt.get("type") != "text"),
                                   (PARAM, req.structured_outputs is not None),
                                   *((name, getattr(req, name) is not None) for name in LEGACY)) if on]
    if len(asked) > 1:
        raise APIError(400, f"a request takes one output constraint, got {' and '.join(asked)}", param=asked[1],
                       code="invalid_value")
    if req.guided_whitespace_pattern is not None and asked != ["guided_json"]:
        raise APIError(400, "guided_whitespace_pattern applies to guided_json only", code="invalid_value",
                       param="guided_whitespace_pattern")
    return asked[0] if asked else None


def request_grammar(req) -> tuple[str | None, str | None]:
    """The grammar a request asks for and the field that asked; (None, None) for free text.
    guided_decoding_backend is accepted and has no effect: llguidance serves every kind."""
    param = grammar_param(req)
    if param is None:
        return None, None
    if param == "response_format":
        return response_grammar(req.response_format), param
    if param == PARAM:
        return _structured(req.structured_outputs), param
    kind = param.removeprefix("guided_")
    value = getattr(req, param)
    if kind == "json":
        return compiled_grammar("json", _schema(value, param), param, req.guided_whitespace_pattern), param
    return _text(kind, value, param), param


def _structured(so: StructuredOutputs) -> str:
    if so.structural_tag is not None:
        raise APIError(400, "structured_outputs.structural_tag is not supported (use json, regex, choice or grammar)",
                       param=f"{PARAM}.structural_tag", code="unsupported_parameter")
    values = {"json": so.json_schema, "regex": so.regex, "choice": so.choice, "grammar": so.grammar,
              "json_object": so.json_object or None}
    given = [k for k in KINDS if values[k] is not None]
    if len(given) != 1:
        raise APIError(400, f"structured_outputs takes exactly one of {', '.join(KINDS)}, got "
                            f"{', '.join(given) or 'none'}", param=PARAM, code="invalid_value")
    kind = given[0]
    param = f"{PARAM}.{kind}"
    is_json = kind in ("json", "json_object")
    if so.whitespace_pattern is not None and (not is_json or so.disable_any_whitespace):
        raise APIError(400, "structured_outputs.whitespace_pattern applies to json and json_object, without "
                            "disable_any_whitespace", param=f"{PARAM}.whitespace_pattern", code="invalid_value")
    if not is_json:
        return _text(kind, values[kind], param)
    # JSON_LAYOUT already allows no free whitespace, which is what disable_any_whitespace asks for.
    schema = None if kind == "json_object" else _schema(so.json_schema, param)
    if so.disable_additional_properties and schema is not None:
        schema = _closed(schema)
    return compiled_grammar("json", schema, param, so.whitespace_pattern)


def _schema(value, param: str) -> dict:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise APIError(400, f"{param} is not valid JSON: {exc}", param=param, code="invalid_value") from None
        except RecursionError:  # JSON text nested deeper than the parser's stack
            raise APIError(400, f"{param}: the schema is nested too deep", param=param, code="invalid_value") from None
    if not isinstance(value, dict):
        raise APIError(400, f"{param} must be a JSON schema object", param=param, code="invalid_value")
    return value


def _closed(schema):
    # vLLM's disable_additional_properties: every object schema that does not say otherwise allows
    # only its named properties. Only subschema positions are walked, so a property that happens
    # to be called "properties" or "type" is left alone.
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in _MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: _closed(sub) for name, sub in out[key].items()}
    for key in _LISTS:
        if isinstance(out.get(key), list):
            out[key] = [_closed(sub) for sub in out[key]]
    for key in _ONE:
        if isinstance(out.get(key), (dict, list)):
            sub = out[key]
            out[key] = [_closed(s) for s in sub] if isinstance(sub, list) else _closed(sub)
    if (out.get("type") == "object" or "properties" in out) and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def _text(kind: str, value, param: str) -> str:
    if kind == "choice" and not value:
        raise APIError(400, f"{param} needs at least one choice", param=param, code="invalid_value")
    return compiled_grammar(kind, value, param)


def constraint_source(req) -> tuple[str, dict | None] | None:
    """(the field path of the request's constraint source, its JSON schema when it is one), or None
    for free text. Only called for a request whose constraint was parsed already (no 400 here)."""
    param = grammar_param(req)
    if param is None:
        return None
    if param == "response_format":
        fmt = req.response_format
        if fmt.get("type") != "json_schema":
            return param, None
        return f"{param}.json_schema.schema", _schema_dict((fmt.get("json_schema") or {}).get("schema"))
    if param == PARAM:
        so = req.structured_outputs
        kind = next((k for k in KINDS if getattr(so, "json_schema" if k == "json" else k, None) not in (None, False)),
                    None)
        if kind is None:
            return param, None
        return f"{param}.{kind}", (_schema_dict(so.json_schema) if kind == "json" else None)
    return param, (_schema_dict(getattr(req, param)) if param == "guided_json" else None)


def _schema_dict(value) -> dict | None:
    if isinstance(value, str):  # a schema sent as JSON text (it parsed before the probe ran)
        value = json.loads(value)
    return value if isinstance(value, dict) else None

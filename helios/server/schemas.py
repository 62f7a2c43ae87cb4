"""OpenAI request schemas (pydantic) and the parsing that turns a raw body into one.

Requests are validated strictly: unknown fields and wrong JSON types are rejected with a 400
instead of being ignored or coerced (OpenAI's own API also rejects unrecognized arguments; vLLM
instead accepts them with a logged warning). We reject, because a misspelled option that is
silently dropped (`max_token`, `temprature`) gives wrong output with no sign of why, and the
fields that real clients send are known: the OpenAI ones below, and the vLLM extensions that
load tools rely on (`ignore_eos`, `min_tokens`, `stop_token_ids`,
`stream_options.continuous_usage_stats`) or that chat front ends send
(`repetition_penalty`). Fields that do not change the output here (`store`,
`metadata`) are accepted and have no effect; `user`, `service_tier` and vLLM's `priority` choose the
request's tenant and service class (service_classes.py).
Known OpenAI fields that this server cannot honour (tools, suffix, best_of > 1, audio, ...)
are accepted by the schema only so that the translation step can reject them with a message
that names the feature rather than a generic "extra field" error.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError
from pydantic.json_schema import SkipJsonSchema

from helios.server.errors import APIError



def _finite(**bounds):
    return Field(default=None, allow_inf_nan=False, **_ranged(bounds))  # JSON NaN/Infinity are rejected


def _ranged(bounds: dict) -> dict:
    # The documented range goes into the OpenAPI schema only (clients and schema-driven fuzzing read
    # it); translation checks it, so that its 400 names the parameter in OpenAI's words.
    return {"json_schema_extra": bounds} if bounds else {}


def _int(**bounds):
    return Field(default=None, **_ranged(bounds))


TokenId = Annotated[int, Field(json_schema_extra={"minimum": 0})]


# OpenAI's API marks `stream` and `echo` nullable, and clients that serialize every field send null.
NullAsFalse = Annotated[bool, BeforeValidator(lambda v: False if v is None else v)]
NullAsTrue = Annotated[bool, BeforeValidator(lambda v: True if v is None else v)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(_Strict):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM: usage on every chunk


class ContentPart(BaseModel):
    # Extra keys allowed: an image part carries image_url, and is rejected by type with a clear
    # message in translation rather than by an opaque schema error.
    model_config = ConfigDict(extra="allow", strict=True)
    type: str
    text: str | None = None


class ChatMessage(_Strict):
    # "tool" and "function" messages, tool_calls and tool_call_id belong to function calling: known
    # here so that translation can reject them by name. OpenAI lets an assistant message that makes
    # tool calls omit its content.
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[Any] | None = None
    tool_call_id: str | None = None


class StructuredOutputs(_Strict):
    """vLLM's `structured_outputs` (helios.server.structured_outputs): one constraint, with options."""

    json_schema: dict[str, Any] | str | None = Field(default=None, alias="json")  # a schema, or its JSON text
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None  # Lark or llama.cpp GBNF
    json_object: bool | None = None
    whitespace_pattern: str | None = None
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    disable_fallback: bool = False
    structural_tag: Any = None  # refused by name


class _Sampling(_Strict):
    """Fields shared by completions and chat completions."""

    model: str | None = None
    max_tokens: int | None = _int(minimum=1)
    temperature: float | None = _finite(minimum=0, maximum=2)
    top_p: float | None = _finite(minimum=0, maximum=1)
    top_k: int | None = _int(minimum=-1)
    min_p: float | None = _finite(minimum=0, maximum=1)  # vLLM extension
    seed: int | None = _int(minimum=0, maximum=2**63 - 1)
    stop: str | list[str] | None = Field(default=None, json_schema_extra={"maxItems": 4})
    n: int | None = _int(minimum=1, maximum=128)
    stream: NullAsFalse = False
    stream_options: StreamOptions | None = None
    response_format: dict[str, Any] | None = None  # chat, and completions as in vLLM (response_format.py)
    # vLLM's structured outputs, and the guided_* fields vLLM 0.12 removed (structured_outputs.py).
    # Those are accepted but left out of the published schema, as vLLM left them out of its API.
    structured_outputs: StructuredOutputs | None = None
    guided_json: SkipJsonSchema[dict[str, Any] | str | None] = None
    guided_regex: SkipJsonSchema[str | None] = None
    guided_choice: SkipJsonSchema[list[str] | None] = None
    guided_grammar: SkipJsonSchema[str | None] = None
    guided_whitespace_pattern: SkipJsonSchema[str | None] = None
    guided_decoding_backend: SkipJsonSchema[str | None] = None
    user: str | None = None
    store: bool | None = None
    metadata: dict[str, str] | None = None
    service_tier: str | None = None  # selects the service class (service_classes.py, --class-field)
    priority: int | None = _int()  # vLLM's: lower is more urgent (service_classes.py)
    # vLLM extensions
    include_stop_str_in_output: NullAsFalse = False
    skip_special_tokens: NullAsTrue = True
    ignore_eos: bool = False
    min_tokens: int | None = _int(minimum=0)
    stop_token_ids: list[TokenId] | None = None
    allowed_token_ids: list[TokenId] | None = None
    presence_penalty: float | None = _finite(minimum=-2, maximum=2)
    frequency_penalty: float | None = _finite(minimum=-2, maximum=2)
    repetition_penalty: float | None = _finite(minimum=1e-6, maximum=1e6)  # vLLM extension
    logit_bias: dict[str, Annotated[float, Field(allow_inf_nan=False, json_schema_extra={
        "minimum": -100, "maximum": 100})]] | None = None


class CompletionRequest(_Sampling):
    prompt: str | list[str] | list[TokenId] | list[list[TokenId]]
    echo: NullAsFalse = False
    suffix: str | None = None
    best_of: int | None = _int(minimum=1, maximum=1)
    logprobs: int | None = _int(minimum=0, maximum=20)


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = _int(minimum=1)
    logprobs: bool | None = None
    top_logprobs: int | None = _int(minimum=0, maximum=20)
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    functions: list[Any] | None = None  # OpenAI's deprecated form of tools
    function_call: Any = None
    # OpenAI features this text model cannot serve: accepted when they ask for nothing (null, or
    # text-only output), else rejected by name in translation.
    modalities: list[str] | None = None
    audio: dict[str, Any] | None = None
    prediction: dict[str, Any] | None = None
    reasoning_effort: str | None = None
    # vLLM's chat template extensions: continue_final_message leaves the last message open, so the
    # model continues it (a prefilled answer); it needs add_generation_prompt false.
    add_generation_prompt: NullAsTrue = True
    continue_final_message: NullAsFalse = False
    chat_template_kwargs: dict[str, Any] | None = None  # further template variables, e.g. enable_thinking


def parse_body(model: type[BaseModel], raw: bytes):
    """Validate a raw request body; every failure becomes a 400 in OpenAI's error shape."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise APIError(400, f"the request body is not valid UTF-8 (byte {exc.start})",
                       code="invalid_encoding") from None
    if not text.strip():
        raise APIError(400, "the request body is empty; send a JSON object", code="invalid_json")
    try:
        return model.model_validate_json(text)
    except ValidationError as exc:
        raise _validation_error(exc) from None


def _validation_error(exc: ValidationError) -> APIError:
    # Report the first problem only, like OpenAI; a union field yields one error per branch,
    # so the message for a wrong type lists what the field accepts.
    errors = exc.errors(include_url=False)
    first = errors[0]
    loc = [p for p in first["loc"] if not _is_union_tag(p)]
    param = ".".join(str(p) for p in loc) or None
    kind = first["type"]
    if kind == "json_invalid":
        return APIError(400, f"the request body is not valid JSON: {first['msg']}", code="invalid_json")
    if kind == "model_type" and not loc:
        return APIError(400, "the request body must be a JSON object", code="invalid_json")
    if kind == "extra_forbidden":
        return APIError(400, f"Unrecognized request argument supplied: {param}", param=param,
                        code="unknown_parameter")
    if kind == "missing":
        return APIError(400, f"Missing required parameter: '{param}'", param=param, code="missing_parameter")
    same = [e for e in errors if [p for p in e["loc"] if not _is_union_tag(p)][:len(loc)] == loc]
    msgs = sorted({e["msg"] for e in same})
    detail = msgs[0] if len(msgs) == 1 else "; or ".join(msgs)
    return APIError(400, f"Invalid value for '{param}': {detail}", param=param, code="invalid_value")


def _is_union_tag(part) -> bool:
    # pydantic inserts the branch name (e.g. 'str', 'list[int]') into the location of errors
    # inside a union; clients only care about the field path.
    return isinstance(part, str) and ("[" in part or part in ("str", "int", "float", "bool", "ContentPart"))

"""`--chat-template`: a Jinja chat template that replaces the model's (vLLM's flag of that name).

The value is a file's path, or the template itself when no such file exists and it holds a Jinja
tag. It is compiled at startup, before the model loads, so a syntax error is a one-line error
naming the flag, not a 400 on every chat request.
"""

from __future__ import annotations

import pathlib

from helios.errors import ConfigError


def _environment():
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    # transformers' template renderer uses the same options.
    return ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)


def load_chat_template(value: str) -> str:
    """The template text of `--chat-template VALUE`; ConfigError("chat_template") if it is neither a
    readable file nor a template, or does not compile."""
    path = pathlib.Path(value)
    try:
        is_file = path.is_file()
    except OSError:  # a long inline template is no valid path
        is_file = False
    if is_file:
        text = path.read_text(encoding="utf-8")
    elif "{%" in value or "{{" in value:
        text = value
    else:
        raise ConfigError("chat_template", f"no such file {value!r} (and it is no Jinja template either)")
    from jinja2 import TemplateSyntaxError

    try:
        _environment().from_string(text)
    except TemplateSyntaxError as exc:
        raise ConfigError("chat_template", f"the template does not compile: {exc} (line {exc.lineno})") from None
    return text


class TemplatedTokenizer:
    """`tokenizer` with its chat template replaced; everything else is the tokenizer's own."""

    def __init__(self, tokenizer, template: str):
        self._tokenizer = tokenizer
        self.chat_template = template
        self._compiled = _environment().from_string(template)

    def __getattr__(self, name: str):
        return getattr(self._tokenizer, name)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True, **variables) -> str:
        return self._compiled.render(**variables, messages=messages, add_generation_prompt=add_generation_prompt)

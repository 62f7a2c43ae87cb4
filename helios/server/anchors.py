"""Exact token endpoints of a chat prompt's completed messages (checkpoint anchors).

The native frontend supplies them: for each message prefix, the template renders the
conversation up to that message's end; when that text is a prefix of the whole prompt and its
tokens are a prefix of the prompt's tokens, its token count is an exact endpoint. ChatML ends a
message with special tokens, so the tokenization agrees at these boundaries; an endpoint where it
would not is left out rather than guessed.
"""

from __future__ import annotations


def message_endpoints(tokenizer, messages: list[dict], text: str, ids: list[int],
                      variables: dict | None = None) -> tuple[int, ...]:
    """Strictly increasing offsets in (0, len(ids)) where a completed message ends (`variables`:
    the further template variables `text` was rendered with)."""
    out: list[int] = []
    for i in range(1, len(messages) + 1):
        try:
            part = tokenizer.apply_chat_template(messages[:i], add_generation_prompt=False, **(variables or {}))
        except Exception:  # a template may refuse a partial conversation: no anchor there
            continue
        if not text.startswith(part):
            continue
        head = tokenizer.encode(part)
        n = len(head)
        if 0 < n < len(ids) and ids[:n] == head and (not out or n > out[-1]):
            out.append(n)
    return tuple(out)

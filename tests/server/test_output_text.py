"""What the output text shows, with the real model (helios.runtime.publication): vLLM's
skip_special_tokens.

Rules tested:
- by default (vLLM's default) a special token the model generates shows no text, and its id still
  counts in usage;
- skip_special_tokens false shows it.
"""

from __future__ import annotations

from .test_response_format import real  # noqa: F401 (a fixture: the real model's server)


def test_special_tokens_show_no_text_unless_asked(real):  # noqa: F811
    tok = real.app.state.service.backend.tokenizer
    start = tok.encode("<|im_start|>")[0]  # forced by logit_bias at every position
    body = {"prompt": "Hello", "max_tokens": 3, "temperature": 0, "logit_bias": {str(start): 100}}
    for extra, text in (({}, ""), ({"skip_special_tokens": True}, ""),
                        ({"skip_special_tokens": False}, "<|im_start|>" * 3)):
        r = real.post("/v1/completions", json={**body, **extra})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] == text and r.json()["usage"]["completion_tokens"] == 3

"""Issue 43: what clients expect from a vLLM-style server. --served-model-name aliases, vLLM's
/tokenize, /detokenize and /version, and a --chat-template override."""

from __future__ import annotations


import httpx
import openai
import pytest

import helios
from helios.cli import main
from helios.server import EngineOptions, ServerSettings, build_backend, create_app
from helios.server.chat_template import TemplatedTokenizer, load_chat_template

from .support import FlareServer, InProcessServer


@pytest.fixture(scope="module")
def server():
    backend = build_backend(EngineOptions(engine="sim", slots=2, max_context=256))
    backend.model_id, backend.served_names = "gpt-4o", ("gpt-4o", "helios-sim")
    s = InProcessServer(create_app(backend, ServerSettings()))
    yield s
    s.stop()


def test_every_served_name_is_accepted_and_the_first_is_reported(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x")
    assert [m.id for m in client.models.list()] == ["gpt-4o", "helios-sim"]
    for name in ("gpt-4o", "helios-sim"):
        r = client.completions.create(model=name, prompt="ab", max_tokens=3)
        assert r.model == "gpt-4o" and r.choices[0].text == "aba"
    with pytest.raises(openai.NotFoundError, match="serves 'gpt-4o', 'helios-sim'"):
        client.completions.create(model="llama", prompt="ab", max_tokens=3)


def test_tokenize_prompt_and_messages_as_vllm(server):
    r = httpx.post(server.url + "/tokenize", json={"model": "helios-sim", "prompt": "héllo",
                                                   "return_token_strs": True})
    body = r.json()
    assert r.status_code == 200 and body["tokens"] == list("héllo".encode())
    assert body["count"] == 6 and body["max_model_len"] == 256 and len(body["token_strs"]) == 6
    chat = httpx.post(server.url + "/tokenize", json={"messages": [{"role": "user", "content": "hi"}]}).json()
    assert chat["tokens"] == list(b"<|user|>hi\n<|assistant|>") and chat["token_strs"] is None
    bad = httpx.post(server.url + "/tokenize", json={"prompt": "a", "messages": []})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "prompt"


def test_detokenize_and_version(server):
    r = httpx.post(server.url + "/detokenize", json={"tokens": list("héllo".encode())})
    assert r.json() == {"prompt": "héllo"}
    bad = httpx.post(server.url + "/detokenize", json={"tokens": [999]})
    assert bad.status_code == 400 and "outside the vocabulary" in bad.json()["error"]["message"]
    wrong = httpx.post(server.url + "/detokenize", json={"model": "nope", "tokens": [1]})
    assert wrong.status_code == 404
    assert httpx.get(server.url + "/version").json() == {"version": helios.__version__}


def test_chat_template_override_renders_chat_requests(tmp_path):
    path = tmp_path / "t.jinja"
    path.write_text("{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}"
                    "{% if add_generation_prompt %}>{% endif %}")
    assert load_chat_template(str(path)) == path.read_text()
    backend = build_backend(EngineOptions(engine="sim", slots=2, max_context=256))
    tok = TemplatedTokenizer(backend.tokenizer, load_chat_template(str(path)))
    assert tok.apply_chat_template([{"role": "user", "content": "x"}]) == "[user]x>"
    assert tok.encode("ab") == [97, 98]  # everything else is the tokenizer's own


@pytest.mark.parametrize("value,needle", [("/no/such/template.jinja", "no such file"),
                                          ("{% for m in messages %}", "does not compile")])
def test_bad_chat_template_is_a_one_line_error(capsys, value, needle):
    assert main(["run", "--engine", "sim", "--chat-template", value]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--chat-template" in err and needle in err, err


def test_flags_reach_the_server():
    server = FlareServer("--engine", "sim", "--served-model-name", "gpt-4o", "gpt-4o-mini",
                         "--chat-template", "{{ messages[0].content }}!")
    assert server.ready_line == f"flare: serving gpt-4o on http://127.0.0.1:{server.port}", server.error_text()
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="x")
        r = client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "ab"}],
                                           max_tokens=3)
        assert r.model == "gpt-4o" and r.choices[0].message.content == "ab!"
    finally:
        assert server.stop() == 0

"""vLLM's chat template extensions (helios.server.translate): add_generation_prompt,
continue_final_message and chat_template_kwargs.

Rules tested:
- by default the prompt ends with the template's generation prompt; add_generation_prompt false
  leaves it out;
- continue_final_message leaves the last message open: the prompt ends with its content, without
  the end of turn the template writes after it, and an empty final message ends with its header;
- the message endpoints (checkpoint anchors) then name only the completed messages;
- continue_final_message with add_generation_prompt, or a conversation that holds the mark the
  cut uses, is a 400 naming the field;
- chat_template_kwargs reach the template as variables (a template that reads none renders as
  without them), the message endpoints are found under the same variables, and a variable that
  would override the request's own (messages, add_generation_prompt) is a 400;
- with the real model, a prefilled answer is continued, not restarted.
"""

from __future__ import annotations

import openai
import pytest

from helios.engine.byte_tokenizer import ByteTokenizer
from helios.engine.model.tokenizer import Tokenizer
from helios.server.errors import APIError
from helios.server.schemas import ChatCompletionRequest
from helios.server.translate import prepare_chat

from .test_response_format import real  # noqa: F401 (a fixture: the real model's server)

ASK = {"role": "user", "content": "What is the capital of France?"}
TOK = ByteTokenizer()


def prompt(messages, **fields) -> tuple[str, tuple[int, ...]]:
    prepared = prepare_chat(ChatCompletionRequest(messages=messages, **fields), TOK, 512, TOK.vocab_size)
    choice = prepared.choices[0]
    return TOK.decode(choice.prompt_ids), choice.params.endpoints


def test_the_generation_prompt_is_there_unless_turned_off():
    assert prompt([ASK])[0] == "<|user|>What is the capital of France?\n<|assistant|>"
    assert prompt([ASK], add_generation_prompt=False)[0] == "<|user|>What is the capital of France?\n"


def test_continue_final_message_leaves_the_last_message_open():
    answer = {"role": "assistant", "content": "The capital is"}
    text, endpoints = prompt([ASK, answer], add_generation_prompt=False, continue_final_message=True)
    assert text == "<|user|>What is the capital of France?\n<|assistant|>The capital is"
    assert endpoints == (len("<|user|>What is the capital of France?\n"),)  # the open message is no anchor
    empty, _ = prompt([ASK, {"role": "assistant", "content": ""}], add_generation_prompt=False,
                      continue_final_message=True)
    assert empty == "<|user|>What is the capital of France?\n<|assistant|>"


@pytest.mark.parametrize("messages,fields,param", [
    ([ASK], {"continue_final_message": True}, "continue_final_message"),
    ([{"role": "assistant", "content": "a\x00helios-continue-final-message\x00b"}],
     {"continue_final_message": True, "add_generation_prompt": False}, "messages"),
])
def test_a_conflict_or_an_uncuttable_conversation_is_a_400(messages, fields, param):
    with pytest.raises(APIError) as err:
        prompt(messages, **fields)
    assert err.value.status == 400 and err.value.param == param


def test_chat_template_kwargs_are_template_variables():
    tok = Tokenizer.from_gguf()
    plain = prepare_chat(ChatCompletionRequest(messages=[ASK]), tok, 512, tok.vocab_size).choices[0]
    same = prepare_chat(ChatCompletionRequest(messages=[ASK], chat_template_kwargs={"enable_thinking": False}),
                        tok, 512, tok.vocab_size).choices[0]
    assert same.prompt_ids == plain.prompt_ids  # SmolLM2's template reads no such variable
    tok.chat_template = ("{% if enable_thinking %}<think>{% endif %}{% for m in messages %}<|im_start|>"
                         "{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                         "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    answer = {"role": "assistant", "content": "Paris."}
    req = ChatCompletionRequest(messages=[ASK, answer, ASK], chat_template_kwargs={"enable_thinking": True})
    choice = prepare_chat(req, tok, 512, tok.vocab_size).choices[0]
    assert tok.decode(choice.prompt_ids).startswith("<think><|im_start|>user")
    assert len(choice.params.endpoints) == 3  # found under the same variable: every completed message
    for taken in ("messages", "add_generation_prompt"):
        with pytest.raises(APIError) as err:
            prompt([ASK], chat_template_kwargs={taken: 1})
        assert err.value.param == "chat_template_kwargs"


def test_the_real_model_continues_a_prefilled_answer(real):  # noqa: F811
    oc = openai.OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=real, max_retries=0)
    out = oc.chat.completions.create(
        model="SmolLM2-135M-Instruct", messages=[ASK, {"role": "assistant", "content": "The capital of France"}],
        max_tokens=8, temperature=0,
        extra_body={"add_generation_prompt": False, "continue_final_message": True}).choices[0].message.content
    assert out.startswith(" is Paris"), out
    r = real.post("/v1/chat/completions", json={"messages": [ASK], "continue_final_message": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "continue_final_message", r.text

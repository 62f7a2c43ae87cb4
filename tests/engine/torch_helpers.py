"""Shared pieces of the real-model engine tests: the model loaded once per module, chat
prompts, and hand-built plans and lanes."""

from __future__ import annotations

import pytest
import torch

from helios.engine.torch_core import load_model
from helios.scheduler import Lane, ScheduledPlan, SelectionReason


@pytest.fixture(scope="module")
def loaded():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # two threads slow down 5-10x on a loaded 2-core box
    yield load_model()
    torch.set_num_threads(threads)


def chat(tok, text):
    return tok.encode(tok.apply_chat_template([{"role": "user", "content": text}]))


def plan(shape, lanes):
    return ScheduledPlan(shape, tuple(lanes), 1, 0.0, 0.0, SelectionReason.ORDINARY, False, False, 0, 0, ())


def lane(handle, slot, prompt_start=0, prompt_tokens=0, context=0, rows=1):
    return Lane(handle, 0, 0, slot, prompt_start, prompt_tokens, context, rows, 1.0, 1.0, 0.0)

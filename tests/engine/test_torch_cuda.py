"""TorchCore's captured CUDA graphs: one per key window (the ladder runs everywhere; the rest
needs a CUDA device and is skipped without one; scripts/gpu-check is the broader check). Every
prepared shape is captured at every window, a replay at each window gives the logits of an
eager forward over the whole cache, and greedy tokens match the CPU's."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from helios.config import PolicyConfig
from helios.engine.torch_core import TorchCore
from helios.engine.torch_graphs import RowWork, capture_windows
from helios.graphs import GraphKind, GraphShape
from helios.runtime.driver import SyncDriver
from helios.scheduler import Scheduler

sys.path.insert(0, str(Path(__file__).parent))
from torch_helpers import chat, loaded  # noqa: E402,F401 (loaded is a fixture)

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_capture_windows_double_from_256_and_end_at_the_cache():
    assert capture_windows(4160, 1) == [256, 512, 1024, 2048, 4160]
    # A window shorter than the graph's rows could never hold one of them.
    assert capture_windows(4160, 300) == [512, 1024, 2048, 4160]
    assert capture_windows(256, 1) == [256]
    assert capture_windows(200, 64) == [200]


@pytest.fixture(scope="module")
def core():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 numerics, as on the CPU
    return TorchCore(request_slots=4, max_batch=4, max_context=1024, prefill_chunks=(64, 256), device="cuda")


@cuda
def test_every_shape_is_captured_at_every_window(core):
    for shape, graph in core.graphs.items():
        assert sorted(graph.captures) == capture_windows(core.cache.max_context, graph.length), shape.label()


@cuda
def test_a_replay_at_each_window_gives_the_eager_forward_over_the_whole_cache(core):
    # Slot 0 holds 1,000 real positions (one eager prefill), so every window attends to real keys.
    model, cache = core.model, core.cache
    ids = torch.arange(1000, device="cuda")[None] % 5000 + 100
    model(ids, torch.arange(1000, device="cuda")[None], torch.tensor([0], device="cuda"), cache)
    graph = core.graphs[GraphShape(GraphKind.DECODE, 4, 1)]
    for start in (10, 300, 700, 999):  # windows 256, 512, 1024 and the whole cache
        graph.pack([RowWork(0, (42,), start, True)])
        replayed = graph.forward(model, cache)[0, -1].clone()
        eager = model(torch.tensor([[42]], device="cuda"), torch.tensor([[start]], device="cuda"),
                      torch.tensor([0], device="cuda"), cache, kv_window=cache.max_context)[0, -1]
        assert float((replayed - eager).abs().max()) < 1e-3, start


@cuda
def test_greedy_tokens_match_the_cpu(core, loaded):
    def greedy(c):
        d = SyncDriver(Scheduler(c.catalog, PolicyConfig(), c.scheduler_config()), c)
        hs = [d.submit(chat(c.tokenizer, q), 24) for q in ("What is the capital of France?", "Name three colors.")]
        d.run()
        return [d.requests[h].tokens for h in hs]

    assert greedy(core) == greedy(TorchCore(loaded=loaded, request_slots=4, max_batch=4, max_context=512))

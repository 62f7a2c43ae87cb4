"""Golden tests of the Llama forward: a known answer, batching/padding, chunked prefill, the KV row gather."""

import pytest
import torch

from helios.engine.model import KVCache, LlamaModel, Tokenizer, generate_greedy, load_weights

MAX_CONTEXT = 512  # small caches keep these tests cheap


@pytest.fixture(scope="module")
def model_and_tok():
    # One thread: on the shared 2-core CI box two OpenMP threads slow down
    # 5-10x whenever another process holds a core; one thread degrades gently.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    config, weights = load_weights()
    model = LlamaModel(config, weights)
    del weights
    yield model, Tokenizer.from_gguf()
    torch.set_num_threads(threads)


def chat_ids(tok, text):
    return tok.encode(tok.apply_chat_template([{"role": "user", "content": text}]))


def test_capital_of_france(model_and_tok):
    model, tok = model_and_tok
    cache = KVCache(model.config, num_slots=2, max_context=MAX_CONTEXT)
    out = generate_greedy(model, tok, chat_ids(tok, "What is the capital of France?"), 12,
                          cache, slot=1)
    text = tok.decode(out)
    assert "Paris" in text, text
    assert out[-1] == tok.eos_id  # "The capital of France is Paris.<|im_end|>"


def test_batched_padded_matches_alone(model_and_tok):
    model, tok = model_and_tok
    texts = ("What is the capital of France?", "Name three colors.",
             "Write a haiku about the sea and the moon.")
    prompts = [chat_ids(tok, t) for t in texts]
    n_new = 8
    alone = []
    for ids in prompts:
        cache = KVCache(model.config, num_slots=1, max_context=MAX_CONTEXT)
        alone.append(generate_greedy(model, tok, ids, n_new, cache, slot=0)[:n_new])

    # One fixed-shape batch: 3 real rows in shuffled slots plus 1 padding row
    # routed to the scratch slot; slot 3 is never used and must stay untouched.
    cache = KVCache(model.config, num_slots=5, max_context=MAX_CONTEXT)
    cache.k[:, 3] = 7.0
    slot_of = [2, 0, 4]
    scratch = cache.scratch_slot
    B, L = 4, max(map(len, prompts)) + 3
    tokens = torch.zeros(B, L, dtype=torch.long)
    # Padded tail positions continue past each row's real ones (the invariant);
    # the padding row uses arbitrary positions in the scratch slot.
    positions = torch.arange(L).repeat(B, 1)
    for b, ids in enumerate(prompts):
        tokens[b, :len(ids)] = torch.tensor(ids)
    slots = torch.tensor(slot_of + [scratch])
    last = torch.tensor([len(p) - 1 for p in prompts] + [0])
    next_ids = model(tokens, positions, slots, cache)[torch.arange(B), last].argmax(-1)

    got = [[int(next_ids[b])] for b in range(3)]
    lengths = [len(p) for p in prompts]
    for step in range(n_new - 1):
        # Alternate 1-wide steps and 3-wide steps whose tails are padding that
        # lands on future positions and gets overwritten by later real tokens.
        width = 1 if step % 2 == 0 else 3
        tokens = torch.zeros(B, width, dtype=torch.long)
        positions = torch.zeros(B, width, dtype=torch.long)
        for b in range(3):
            tokens[b, 0] = got[b][-1]
            positions[b] = lengths[b] + torch.arange(width)
            lengths[b] += 1
        positions[3] = torch.tensor([5, 9, 1][:width])
        logits = model(tokens, positions, slots, cache)
        for b in range(3):
            got[b].append(int(logits[b, 0].argmax()))
    assert got == alone
    assert torch.all(cache.k[:, 3] == 7.0) and torch.all(cache.v[:, 3] == 0.0)


def test_chunked_prefill_matches_one_shot(model_and_tok):
    model, tok = model_and_tok
    ids = chat_ids(tok, "Explain in one sentence why the sky is blue.")
    n, split = len(ids), 17
    one = KVCache(model.config, num_slots=1, max_context=MAX_CONTEXT)
    ref = model(torch.tensor([ids]), torch.arange(n)[None], torch.tensor([0]), one)

    # Two chunks at different positions, into a different slot of a bigger
    # cache, the second chunk batched with a padding row on the scratch slot.
    two = KVCache(model.config, num_slots=3, max_context=MAX_CONTEXT)
    model(torch.tensor([ids[:split]]), torch.arange(split)[None], torch.tensor([1]), two)
    rest = torch.tensor([ids[split:], [0] * (n - split)])
    pos = torch.stack([torch.arange(split, n), torch.arange(n - split)])
    out = model(rest, pos, torch.tensor([1, two.scratch_slot]), two)
    torch.testing.assert_close(out[0], ref[0, split:], atol=1e-4, rtol=0)
    # logits_at computes just the requested position of each row.
    last = model(rest, pos, torch.tensor([1, two.scratch_slot]), two,
                 logits_at=torch.tensor([n - split - 1, 0]))
    assert last.shape == (2, 1, model.config.vocab_size)
    torch.testing.assert_close(last[0, 0], ref[0, -1], atol=1e-4, rtol=0)


def test_kv_rows_match_index_select_and_reuse_one_buffer(model_and_tok):
    # KVCache.rows copies a layer's key/value windows into buffers the cache keeps (a fresh
    # 10-100 MB tensor per layer and step costs page faults); the values must be index_select's.
    model, _ = model_and_tok
    cache = KVCache(model.config, num_slots=6, max_context=256)
    torch.manual_seed(0)
    cache.k.copy_(torch.randn_like(cache.k))
    cache.v.copy_(torch.randn_like(cache.v))
    pointers = set()
    for slots, window, layer in (([3, 0, 5], 128, 0), ([1], 64, 7), ([2, 2, 4, 0, 1, 3], 256, 29), ([5, 1], 192, 3)):
        index = torch.tensor(slots)
        keys, values = cache.rows(layer, index, window)
        assert torch.equal(keys, cache.k[layer][:, :, :window].index_select(0, index))
        assert torch.equal(values, cache.v[layer][:, :, :window].index_select(0, index))
        assert keys.shape == (len(slots), model.config.n_kv_heads, window, model.config.head_dim)
        if len(slots) == 1:  # one row is a view of its slot's block: no copy
            assert keys.data_ptr() == cache.k[layer][slots[0]].data_ptr()
            assert values.data_ptr() == cache.v[layer][slots[0]].data_ptr()
        else:
            pointers.add(keys.data_ptr())
    # The buffer grew once (to the 6-row, 256-key gather) and was reused by every smaller one.
    assert len(pointers) == 2

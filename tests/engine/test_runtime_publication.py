"""Publication: stop-string buffering and UTF-8-safe incremental detokenization."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from helios.engine.byte_tokenizer import ByteTokenizer  # noqa: E402
from runtime_helpers import DecodeOnlyTokenizer, ScriptedCore, make_runtime, resources  # noqa: E402

from helios.runtime.publication import Publication, held_suffix  # noqa: E402

pytestmark = pytest.mark.timeout(60)


def run_scripted(texts, stop=(), max_tokens=64, tokenizer=DecodeOnlyTokenizer(), **params):
    """Submit one request per text (its tokens are the text's bytes) and collect the events."""
    rt, sched, core = make_runtime(ScriptedCore, tokenizer=tokenizer, scale=0.05)
    initial = resources(sched)
    out = []
    with rt:
        streams = [rt.submit([1, 2, 3], max_tokens=max_tokens, stop=stop, **params,
                             core_options={"script": list(t.encode())}) for t in texts]
        for s in streams:
            events = []
            while (e := s.next_event(20)) is not None:
                events.append(e)
            out.append((s, events))
        assert rt.wait_idle(10)
        assert resources(sched) == initial  # stopped requests were cancelled and released
    return out


def test_stop_string_split_across_bursts_is_never_leaked():
    """Rule: one byte per burst spells the stop string; none of it is ever published."""
    texts = ["Hello STOP world", "STOP at once", "no stop here", "near STO! miss, then STOPPED"]
    results = run_scripted(texts, stop=("STOP", "never-seen"))
    expected = [("Hello ", "stop"), ("", "stop"), ("no stop here", "stop"), ("near STO! miss, then ", "stop")]
    for (s, events), (text, reason) in zip(results, expected):
        assert "".join(e.text for e in events) == s.text == text
        assert s.finish_reason == reason
        assert all("STOP" not in e.text for e in events)
    # A disproved prefix is held, then released whole with the character that disproved it.
    _, near = results[3]
    assert any(e.text == "STO!" for e in near)
    # The stopping burst carries the held ids; a stopped request counts what it generated.
    s, _ = results[0]
    assert bytes(s.token_ids).decode() == "Hello STOP"  # ids travel with text, as in vLLM
    assert s.usage.completion_tokens == len("Hello STOP")


def test_include_stop_str_in_output_shows_the_stop_string_that_ended_the_text():
    """Rule (vLLM's include_stop_str_in_output): the text ends with the stop string that ended it,
    also when it was split across bursts; the earliest one wins, and at one position the first
    listed; nothing after it is shown."""
    texts = ["Hello STOP world", "STOP at once", "near STO! miss, then STOPPED", "an END before STOP"]
    results = run_scripted(texts, stop=("STOP", "END", "STOPP"), include_stop_str_in_output=True)
    expected = ["Hello STOP", "STOP", "near STO! miss, then STOP", "an END"]
    for (s, events), text in zip(results, expected):
        assert "".join(e.text for e in events) == s.text == text and s.finish_reason == "stop"
    pub = Publication(DecodeOnlyTokenizer(), ("<end>",), include_stop=True)
    assert "".join(pub.feed([b]).text for b in "ab <e <end> tail".encode()) == "ab <e <end>"


def test_skip_special_tokens_hides_their_text_but_not_their_ids():
    """Rule (vLLM's skip_special_tokens): a special token shows no text, its id is still streamed;
    a tokenizer without special tokens is unaffected."""
    from helios.engine.model.tokenizer import Tokenizer

    tok = Tokenizer.from_gguf()
    ids = tok.encode("Hi<|im_start|> there<|im_end|>")
    assert sum(tok.is_special(i) for i in ids) == 2
    for skip, text in ((True, "Hi there"), (False, "Hi<|im_start|> there<|im_end|>")):
        pub = Publication(tok, (), skip_special=skip)
        pieces = [pub.feed([i]) for i in ids] + [pub.flush()]
        assert "".join(p.text for p in pieces) == text
        assert [i for p in pieces for i in p.token_ids] == ids
    pub = Publication(ByteTokenizer(), (), skip_special=True)
    assert pub.feed(list(b"<|im_start|>")).text == "<|im_start|>"


def test_length_finish_flushes_held_text():
    """Rule: text held as a possible stop prefix is released when the request ends by length."""
    [(s, events)] = run_scripted(["abcST"], stop=("STOP",), max_tokens=5)
    assert (s.text, s.finish_reason) == ("abcST", "length")
    assert events[-1].text == "ST"


def test_multibyte_character_split_across_tokens_is_emitted_whole():
    """Rule: a UTF-8 character whose bytes arrive in separate bursts is published whole."""
    text = "héllo € 😀 ok 中文"
    [(s, events)] = run_scripted([text])
    assert all("\ufffd" not in e.text for e in events)
    assert "".join(e.text for e in events) == text and s.finish_reason == "stop"
    assert "😀" in [e.text for e in events]  # four one-byte bursts became one event
    assert s.usage.completion_tokens == len(text.encode()) + 1  # plus EOS, never shown


def test_no_tokenizer_streams_ids_with_empty_text():
    """Rule: with tokenizer=None, text is "" and token ids are still streamed."""
    [(s, events)] = run_scripted(["xyz"], tokenizer=None)
    assert [e.text for e in events] == [""] * len(events)
    assert s.token_ids == list(b"xyz") and s.finish_reason == "stop"


@pytest.mark.parametrize("tokenizer", [DecodeOnlyTokenizer(), ByteTokenizer()], ids=["decode", "token_bytes"])
def test_publication_unit(tokenizer):
    """Rule: pieces concatenate to the decoded text, minus everything from the stop string on."""
    pub = Publication(tokenizer, ("<end>",))
    data = "añb <e <end> tail".encode()
    pieces = [pub.feed([b]) for b in data]
    shown = "".join(p.text for p in pieces)
    assert shown == "añb <e " and pieces[-1].stopped is False
    assert [p.stopped for p in pieces].count(True) == 1
    assert held_suffix("ab<en", ("<end>", "nd")) == 3 and held_suffix("abc", ("<end>",)) == 0
    tail = Publication(tokenizer, ())
    assert tail.feed([0xE2, 0x82]).text == "" and tail.flush().text == "\ufffd"


@pytest.mark.parametrize("tokenizer", [DecodeOnlyTokenizer(), ByteTokenizer(), None], ids=["decode", "token_bytes", "none"])
def test_logprob_entries_travel_with_their_ids(tokenizer):
    """Rule: with logprobs, each piece carries exactly one entry per id it shows, in order, also
    when ids wait behind a held-back stop-string prefix or a split character; a missing entry is
    None; without logprobs pieces carry none."""
    pub = Publication(tokenizer, ("<end>",) if tokenizer else (), logprobs=True)
    data = "añb <e <end> tail".encode()
    pieces = [pub.feed([b], [f"lp{i}"] if i % 5 else []) for i, b in enumerate(data)]
    pieces.append(pub.flush())
    ids = [t for p in pieces for t in p.token_ids]
    entries = [e for p in pieces for e in (p.logprobs or ())]
    assert all(len(p.logprobs or ()) == len(p.token_ids) for p in pieces)
    assert entries == [None if i % 5 == 0 else f"lp{i}" for i in range(len(ids))]
    assert Publication(tokenizer).feed([65]).logprobs is None

"""IncrementalDetokenizer: streaming byte-level BPE text and stop strings."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from mainspring.engine.detokenizer import IncrementalDetokenizer
from mainspring.engine.params import SamplingParams

CORPUS = [
    "Hello world, the quick brown fox jumps over the lazy dog.",
    "The end of the story is near. STOP here, then stop again.",
    "日本語のテキストです。中文也可以。한국어도 좋아요.",
    "emoji 😀🎉 are fun 👍🏽 and ❤️ too",
    "def f(x):\n    return x * 2  # code\n",
]


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    """A tiny byte-level BPE: few merges, so CJK characters and emoji span several tokens."""
    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<eos>"],
        show_progress=False,
    )
    t.train_from_iterator(CORPUS * 10, trainer)
    return t


def stream(
    tok: Tokenizer, text: str, params: SamplingParams, prompt: str = "Q: "
) -> tuple[list[str], IncrementalDetokenizer]:
    det = IncrementalDetokenizer(tok, tok.encode(prompt).ids, params)
    deltas = []
    for i in tok.encode(text).ids:
        deltas.append(det.add(i))
        if det.finished_by_stop:
            break
    return deltas, det


def test_fixture_splits_characters_across_tokens(tok: Tokenizer):
    pieces = [tok.decode([i]) for i in tok.encode("😀 日本語").ids]
    assert any("\ufffd" in p for p in pieces)


@pytest.mark.parametrize(
    "text",
    [
        "Hello world, the quick brown fox.",
        "日本語のテキストです。",
        "emoji 😀🎉 are fun 👍🏽 and ❤️ too",
        "mixed: abc😀日本😀😀 end\n  indented\ttab",
        "한국어도 좋아요 🎉🎉🎉",
        "x",
    ],
)
def test_deltas_concatenate_to_full_decode(tok: Tokenizer, text: str):
    ids = tok.encode(text).ids
    deltas, det = stream(tok, text, SamplingParams())
    assert all("\ufffd" not in d for d in deltas)  # never a partial character
    assert "".join(deltas) + det.flush() == tok.decode(ids) == text
    assert det.text == text and det.stop_reason is None and not det.finished_by_stop
    assert det.num_output_tokens == len(ids)


def test_partial_character_waits_for_more_tokens(tok: Tokenizer):
    ids = tok.encode("😀").ids
    assert len(ids) > 1
    det = IncrementalDetokenizer(tok, [], SamplingParams())
    assert [det.add(i) for i in ids[:-1]] == [""] * (len(ids) - 1)
    assert det.add(ids[-1]) == "😀"


def test_flush_emits_dangling_bytes_like_full_decode(tok: Tokenizer):
    ids = tok.encode("ok 😀").ids[:-1]  # cut inside the emoji
    det = IncrementalDetokenizer(tok, [], SamplingParams())
    streamed = "".join(det.add(i) for i in ids)
    assert streamed.startswith("ok") and "\ufffd" not in streamed
    flushed = det.flush()
    assert flushed.endswith("\ufffd") and streamed + flushed == tok.decode(ids)
    assert det.flush() == ""  # idempotent


def test_special_tokens_are_skipped(tok: Tokenizer):
    eos = tok.token_to_id("<eos>")
    det = IncrementalDetokenizer(tok, [], SamplingParams())
    ids = tok.encode("Hello").ids + [eos, eos] + tok.encode(" world").ids
    assert "".join(det.add(i) for i in ids) + det.flush() == "Hello world"


def test_long_stream_matches_and_window_stays_small(tok: Tokenizer):
    text = " ".join(CORPUS) * 3

    class Counting:
        longest = 0

        def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
            Counting.longest = max(Counting.longest, len(ids))
            return tok.decode(ids, skip_special_tokens=skip_special_tokens)

    det = IncrementalDetokenizer(Counting(), tok.encode("a long prompt " * 50).ids, SamplingParams())
    out = "".join(det.add(i) for i in tok.encode(text).ids) + det.flush()
    assert out == text
    assert Counting.longest <= 12  # O(window) per token, not O(length)


def test_stop_string_split_across_tokens(tok: Tokenizer):
    text = "The end of the story is near. STOP here, then stop again."
    params = SamplingParams(stop=["STOP"])
    deltas, det = stream(tok, text, params)
    assert det.finished_by_stop and det.stop_reason == "STOP"
    assert "".join(deltas) == det.text == "The end of the story is near. "
    assert all("S" not in d for d in deltas)  # no prefix of the stop string ever leaked
    assert det.add(tok.encode("more").ids[0]) == ""  # tokens after the stop are ignored
    assert det.flush() == ""


def test_stop_string_spanning_many_tokens_is_held_back(tok: Tokenizer):
    # A multi-word stop string: the text before it streams; its beginning is held while it could match.
    text = "Hello world, the quick brown fox jumps over the lazy dog."
    params = SamplingParams(stop=["quick brown fox"])
    deltas, det = stream(tok, text, params)
    assert det.text == "Hello world, the " and det.stop_reason == "quick brown fox"
    assert "".join(deltas) == "Hello world, the "


def test_include_stop_str_in_output(tok: Tokenizer):
    text = "The end of the story is near. STOP here"
    deltas, det = stream(tok, text, SamplingParams(stop=["STOP"], include_stop_str_in_output=True))
    assert "".join(deltas) == det.text == "The end of the story is near. STOP"


def test_holdback_released_when_match_fails_and_on_flush(tok: Tokenizer):
    det = IncrementalDetokenizer(tok, [], SamplingParams(stop=["the lazy cat"]))
    streamed = "".join(det.add(i) for i in tok.encode("fox jumps over the lazy").ids)
    assert streamed == "fox jumps over "  # "the lazy" could still become "the lazy cat"
    streamed += "".join(det.add(i) for i in tok.encode(" dog. Then the").ids)
    assert streamed == "fox jumps over the lazy dog. Then "  # released; the new "the" is held
    assert det.flush() == "the"  # the request ended for another reason
    assert det.text == "fox jumps over the lazy dog. Then the" and det.stop_reason is None


def test_earliest_match_wins(tok: Tokenizer):
    text = "Hello world, the quick brown fox jumps over the lazy dog."
    _, det = stream(tok, text, SamplingParams(stop=["lazy", "quick", "world"]))
    assert det.stop_reason == "world" and det.text == "Hello "
    # Two stop strings completed by the same token: the one that ends first wins, whatever the
    # tokenization, as a character-by-character scan would find it.
    det = IncrementalDetokenizer(tok, [], SamplingParams(stop=["ab", "xyz", "b"]))
    for i in tok.encode("xxyzab").ids:
        det.add(i)
    assert det.stop_reason == "xyz" and det.text == "x"


def test_stop_in_one_token_with_text_after_it():
    class CharTok:  # one character per token: ids are code points
        def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
            return "".join(map(chr, ids))

    det = IncrementalDetokenizer(CharTok(), [], SamplingParams(stop=["\n\n"]))
    out = "".join(det.add(ord(c)) for c in "line one\n")
    assert out == "line one"  # "\n" held: could start "\n\n"
    assert det.add(ord("\n")) == "" and det.text == "line one" and det.stop_reason == "\n\n"


def test_stop_found_in_flushed_text():
    class ByteTok:  # ids are raw bytes: decoding a cut character gives U+FFFD
        def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
            return bytes(ids).decode("utf-8", errors="replace")

    det = IncrementalDetokenizer(ByteTok(), [], SamplingParams(stop=["é"]))
    out = "".join(det.add(b) for b in "caf".encode())
    out += "".join(det.add(b) for b in "é".encode())
    assert out == "caf" and det.stop_reason == "é"
    det2 = IncrementalDetokenizer(ByteTok(), [], SamplingParams())
    assert "".join(det2.add(b) for b in "né\xff".encode()[:-1]) == "né"
    assert det2.flush() == "\ufffd"


class ChunkTok:
    """Tokens are arbitrary byte chunks of UTF-8 text, so characters split anywhere."""

    def __init__(self) -> None:
        self.chunks: list[bytes] = []

    def encode(self, text: str, rng) -> list[int]:
        data, ids, i = text.encode(), [], 0
        while i < len(data):
            n = rng.randint(1, 4)
            self.chunks.append(data[i : i + n])
            ids.append(len(self.chunks) - 1)
            i += n
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return b"".join(self.chunks[i] for i in ids).decode("utf-8", errors="replace")


def reference_stop(text: str, stops: list[str], include: bool) -> tuple[str, str | None]:
    best = min(((p + len(s), -p, s) for s in stops if (p := text.find(s)) >= 0), default=None)
    if best is None:
        return text, None
    end, neg_start, stop = best
    return text[: end if include else -neg_start], stop


def test_streaming_matches_whole_text_reference():
    import random

    rng = random.Random(0)
    alphabet = ["a", "b", "c", " ", "é", "😀", "日"]
    tok = ChunkTok()
    for case in range(400):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
        stops = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(0, 3))]
        include = rng.random() < 0.3
        expected, reason = reference_stop(text, stops, include)
        det = IncrementalDetokenizer(tok, [], SamplingParams(stop=stops, include_stop_str_in_output=include))
        out = ""
        for i in tok.encode(text, rng):
            out += det.add(i)
            assert expected.startswith(out), (case, text, stops)  # nothing ever leaks
            if det.finished_by_stop:
                break
        out += det.flush()
        assert (out, det.stop_reason) == (expected, reason), (case, text, stops)
        assert det.text == out

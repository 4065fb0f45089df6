"""Tokenizer rebuilt from the embedded GGUF vs transformers' own GGUF tokenizer (the oracle)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers

from mainspring.engine.errors import InvalidRequestError, ModelLoadError
from mainspring.engine.loader import EMBEDDED_MODEL, resolve_model_path
from mainspring.engine.tokenizer import CHATML_TEMPLATE, Tokenizer

SAMPLES = [
    "Hello, world!",
    "12345",
    "a 12 b 3.14159 and 1,000,000.00$",
    "naïve café — “quotes” ‘single’",
    "日本語のテキストと中文",
    "emoji 🎉👍🏽 family 👨‍👩‍👧",
    "def f(x):\n    return x**2\n\n\n",
    "   leading and trailing   ",
    "\t\ttabs\r\nCRLF\n",
    "<|im_start|>user\nhi<|im_end|>\n",
    "<|endoftext|><|im_end|>",
    "It's we'll they've I'M",
    "x" * 60,
    "",
    " ",
    "\n\n\n",
    "العربية Ελληνικά Кириллица",
    "Ωmega ∑∫ ≠ ≤",
    "<repo_name>foo<file_sep>bar",
    "{\"key\": [1, 2, {\"nested\": null}]}",
    "http://example.com/path?q=1&r=2#frag",
]

CONVO = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Hi there"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "What is 2+2?"},
]


@pytest.fixture(scope="module")
def hf_dir(embedded) -> Path:
    return embedded.path  # the converted folder of conftest's session-wide embedded model


@pytest.fixture(scope="module")
def tok(hf_dir: Path) -> Tokenizer:
    return Tokenizer.from_dir(hf_dir)


@pytest.fixture(scope="module")
def oracle():
    transformers = pytest.importorskip("transformers")
    gguf = resolve_model_path(EMBEDDED_MODEL)
    return transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)


@pytest.mark.slow  # needs the embedded model (5-10 s to convert on a fresh checkout)
def test_special_tokens(tok: Tokenizer) -> None:
    assert tok.vocab_size == 49152
    assert tok.bos_token == "<|im_start|>" and tok.bos_token_id == 1
    assert tok.eos_token_ids == [2]
    assert set(range(17)) <= tok.special_token_ids
    assert tok.encode("<|im_start|>") == [1]
    assert tok.encode("<|im_end|>") == [2]
    assert tok.id_to_token(2) == "<|im_end|>"
    assert tok.id_to_token(10**9) == ""


@pytest.mark.slow
def test_digits_split_individually(tok: Tokenizer) -> None:
    ids = tok.encode("x 2024")
    assert [tok.token_text(i) for i in ids] == ["x", " ", "2", "0", "2", "4"]


@pytest.mark.slow
def test_roundtrip_and_token_text(tok: Tokenizer) -> None:
    for s in SAMPLES:
        ids = tok.encode(s)
        assert tok.decode(ids, skip_special_tokens=False) == s
        assert b"".join(tok.token_bytes(i) for i in ids) == s.encode("utf-8")
    assert tok.decode(tok.encode("<|im_start|>user hi<|im_end|>")) == "user hi"
    ids = tok.encode(" world")
    assert len(ids) == 1 and tok.id_to_token(ids[0]) == "Ġworld" and tok.token_text(ids[0]) == " world"


@pytest.mark.slow
def test_encode_matches_transformers(tok: Tokenizer, oracle) -> None:
    for s in SAMPLES:
        ref = oracle.encode(s, add_special_tokens=False)
        assert tok.encode(s) == ref, s
        assert tok.decode(ref, skip_special_tokens=False) == oracle.decode(ref, skip_special_tokens=False)
    assert tok.encode("hi", add_special_tokens=True) == oracle.encode("hi", add_special_tokens=True)


@pytest.mark.slow
@pytest.mark.parametrize("messages", [CONVO, CONVO[1:]], ids=["with-system", "no-system"])
def test_chat_template_matches_transformers(tok: Tokenizer, oracle, messages) -> None:
    ref = oracle.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert tok.apply_chat_template(messages) == ref
    ids = tok.encode_chat(messages)
    assert ids == oracle.encode(ref, add_special_tokens=False)
    assert ids[0] == 1 and ids.count(2) == len(messages) + (messages[0]["role"] != "system")


@pytest.mark.slow
def test_chat_template_default_system_and_no_prompt(tok: Tokenizer) -> None:
    text = tok.apply_chat_template(CONVO[1:2], add_generation_prompt=False)
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert text.endswith("<|im_start|>user\nHi there<|im_end|>\n")


def _tiny_hf() -> HFTokenizer:
    vocab = {c: i for i, c in enumerate(["<s>", "</s>", "<pad>", *"abcdefghijklmnopqrstuvwxyz "])}
    tk = HFTokenizer(models.BPE(vocab=vocab, merges=[]))
    tk.pre_tokenizer = pre_tokenizers.Split(" ", behavior="isolated")
    tk.decoder = decoders.Fuse()
    tk.add_special_tokens(["<s>", "</s>", "<pad>"])
    return tk


def _tiny_tokenizer(template: str | None) -> Tokenizer:
    return Tokenizer(_tiny_hf(), bos_token="<s>", eos_token="</s>", chat_template=template)


def test_template_helpers_and_errors() -> None:
    t = _tiny_tokenizer(
        "{{ bos_token }}{% for m in messages %}{% generation %}{{ m.content | tojson }}{% endgeneration %}"
        "{% endfor %}{% if tools %}{{ tools | tojson(indent=1) }}{% endif %}{{ strftime_now('%Y') | length }}"
        "{{ extra }}"
    )
    out = t.apply_chat_template([{"role": "user", "content": "<a & b>"}], tools=[{"n": 1}], extra="!")
    assert out == '<s>"<a & b>"[\n {\n  "n": 1\n }\n]4!'

    bad = _tiny_tokenizer("{{ raise_exception('only user/assistant roles') }}")
    with pytest.raises(InvalidRequestError, match="only user/assistant roles"):
        bad.apply_chat_template([{"role": "user", "content": "x"}])
    with pytest.raises(ValueError, match="does not compile"):
        _tiny_tokenizer("{% for x in %}").apply_chat_template([{"role": "user", "content": "x"}])
    with pytest.raises(InvalidRequestError):  # the sandbox refuses to mutate objects
        _tiny_tokenizer("{{ messages.append(1) }}").apply_chat_template([{"role": "user", "content": "x"}])
    with pytest.raises(InvalidRequestError, match="role"):
        bad.apply_chat_template([{"content": "no role"}])


def test_chatml_fallback() -> None:
    t = _tiny_tokenizer(None)
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None}]
    assert t.apply_chat_template(msgs) == (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<|im_end|>\n<|im_start|>assistant\n"
    )
    assert t.chat_template is None and CHATML_TEMPLATE


def test_from_dir_variants(tmp_path: Path) -> None:
    d = tmp_path / "tok"
    d.mkdir()
    _tiny_hf().save(str(d / "tokenizer.json"))
    cfg = {"bos_token": {"content": "<s>"}, "eos_token": "</s>", "pad_token": "<pad>",
           "chat_template": [{"name": "default", "template": "A{{ messages[0].content }}"}]}
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 1]}))
    t = Tokenizer.from_dir(d, extra_eos_token_ids=[5])
    assert t.bos_token_id == 0 and t.pad_token_id == 2
    assert t.eos_token_ids == [5, 2, 1]
    assert {0, 1, 2, 5} <= t.special_token_ids
    assert t.encode("ab</s>") == [3, 4, 1] and t.decode([3, 4, 1]) == "ab"
    assert t.apply_chat_template([{"role": "user", "content": "x"}]) == "Ax"
    (d / "chat_template.jinja").write_text("J{{ messages | length }}")
    assert Tokenizer.from_dir(d).apply_chat_template([{"role": "user", "content": "x"}]) == "J1"
    (d / "tokenizer.json").unlink()
    with pytest.raises(ModelLoadError, match="tokenizer.json"):
        Tokenizer.from_dir(d)

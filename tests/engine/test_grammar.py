"""Guided decoding (engine/grammar.py): masks on a tiny tokenizer (fast), then JSON schema, JSON
object, regex and Lark constraints end to end on the embedded model (slow)."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
import torch
from tokenizers import Tokenizer as HFTokenizer, decoders, models

from mainspring.engine.config import EngineConfig
from mainspring.engine.engine import LLMEngine
from mainspring.engine.errors import InvalidRequestError
from mainspring.engine.grammar import GrammarCompiler, apply_bitmask_, bitmask_words, grammar_key
from mainspring.engine.params import SamplingParams
from mainspring.engine.sampler import Sampler
from mainspring.engine.sequence import Sequence

# --- fast: a 29-token character vocabulary, padded to 40 logits -----------------------------------

TOKS = ["<s>", "</s>", *"0123456789-abcxyz{}\":, ", "12", "ab", "-1", '"a"']
EOS, VOCAB = 1, 40
DIGITS = set(range(2, 12))


@pytest.fixture(scope="module")
def tiny() -> GrammarCompiler:
    hf = HFTokenizer(models.BPE(vocab={t: i for i, t in enumerate(TOKS)}, merges=[]))
    hf.decoder = decoders.Fuse()  # a decoder llguidance cannot read: exercises the token-bytes path
    hf.add_special_tokens(["<s>", "</s>"])
    from mainspring.engine.tokenizer import Tokenizer

    return GrammarCompiler(Tokenizer(hf, bos_token="<s>", eos_token="</s>"), vocab_size=VOCAB)


def allowed(matcher) -> set[int]:
    row = torch.empty(bitmask_words(VOCAB), dtype=torch.int32)
    matcher.fill_mask(row)
    logits = torch.zeros(1, VOCAB)
    apply_bitmask_(logits, row.unsqueeze(0))
    return set(torch.isfinite(logits[0]).nonzero().squeeze(1).tolist())


def test_regex_mask_accept_terminate_rollback(tiny):
    m = tiny.compile(SamplingParams(guided_regex=r"\d-\d"))
    assert allowed(m) == DIGITS  # not "12" (two digits), not "-1", no padding ids, no EOS
    assert m.accept(TOKS.index("7"))
    assert allowed(m) == {TOKS.index("-"), TOKS.index("-1")}
    assert m.accept(TOKS.index("-1")) and m.is_terminated()
    assert allowed(m) == {EOS}  # complete: only EOS may follow
    assert m.rollback(1) and not m.is_terminated() and m.num_accepted == 1
    assert not m.accept(TOKS.index("a"))  # a disallowed token puts the matcher in error for good
    assert m.is_terminated() and m.error
    assert allowed(m) == {EOS}  # so the request can still end cleanly


def test_json_and_lark_masks(tiny):
    m = tiny.compile(SamplingParams(guided_json={"type": "object", "properties": {"a": {"type": "integer"}},
                                                 "required": ["a"], "additionalProperties": False}))
    assert allowed(m) == {TOKS.index("{")}
    for t in ["{", '"a"', ":", "12"]:
        assert m.accept(TOKS.index(t)), t
    assert TOKS.index("}") in allowed(m) and TOKS.index("a") not in allowed(m)
    lark = tiny.compile(SamplingParams(guided_grammar='start: "ab" | "xyz"'))
    assert allowed(lark) == {TOKS.index("a"), TOKS.index("ab"), TOKS.index("x")}


def test_compile_cache_and_errors(tiny):
    tiny.compile(SamplingParams(guided_regex="[a-c]+"))
    n = tiny.num_cached
    m1, m2 = (tiny.compile(SamplingParams(guided_regex="[a-c]+")) for _ in range(2))
    assert tiny.num_cached == n and m1 is not m2  # one compiled grammar, a fresh matcher per request
    with pytest.raises(InvalidRequestError, match="unclosed group"):
        tiny.compile(SamplingParams(guided_regex=r"(\d"))
    with pytest.raises(InvalidRequestError, match="nope"):
        tiny.compile(SamplingParams(guided_json={"type": "nope"}))
    with pytest.raises(InvalidRequestError, match="unknown name"):
        tiny.compile(SamplingParams(guided_grammar="start: foo"))
    with pytest.raises(InvalidRequestError, match="at most one"):
        grammar_key(SamplingParams(guided_regex="a", guided_json_object=True))
    with pytest.raises(InvalidRequestError, match="not valid JSON"):
        grammar_key(SamplingParams(guided_json="{oops"))  # type: ignore[arg-type]
    with pytest.raises(InvalidRequestError, match="must be a string"):
        grammar_key(SamplingParams(guided_regex=["a"]))  # type: ignore[arg-type]
    assert grammar_key(SamplingParams()) is None and grammar_key(SamplingParams(guided_regex="")) is None
    assert grammar_key(SamplingParams(guided_json='{"type": "string"}')) == ("json", '{"type": "string"}')


def test_apply_bitmask_bit_31_and_padding():
    vocab = 70  # 3 words, the last one partly padding
    mask = torch.zeros(2, bitmask_words(vocab), dtype=torch.int32)
    mask[0, 0] = -(1 << 31)  # bit 31 is the int32 sign bit: token 31
    mask[1, 2] = -1  # all bits of the last word: tokens 64..69 plus padding bits
    logits = torch.randn(2, vocab)
    apply_bitmask_(logits, mask)
    assert torch.isfinite(logits[0]).nonzero().squeeze(1).tolist() == [31]
    assert torch.isfinite(logits[1]).nonzero().squeeze(1).tolist() == list(range(64, 70))


def test_sampler_masks_only_guided_rows_and_keeps_raw_logprobs(tiny):
    def seq(params: SamplingParams) -> Sequence:
        return Sequence("r", [0], params)

    logits = torch.randn(6, VOCAB, generator=torch.Generator().manual_seed(0))
    logits[:, TOKS.index("z")] = 50.0  # the model's favourite is never a digit
    before = logits.clone()
    guided = [SamplingParams(temperature=0.0, logprobs=1), SamplingParams(temperature=1.0, seed=3),
              SamplingParams(temperature=1.0, top_p=0.5, repetition_penalty=1.3)]
    params = [guided[0], SamplingParams(temperature=0.0), guided[1], guided[2], SamplingParams(temperature=0.0),
              SamplingParams(temperature=1.0, min_tokens=2)]
    masks = {0: tiny.compile(SamplingParams(guided_regex=r"\d")), 2: tiny.compile(SamplingParams(guided_regex=r"\d")),
             3: tiny.compile(SamplingParams(guided_regex=r"\d"))}
    out = Sampler([EOS])(logits, [seq(p) for p in params], masks)
    assert torch.equal(logits, before)  # the caller's logits are untouched
    assert out.token_ids[0] == max(DIGITS, key=lambda t: float(logits[0, t]))  # greedy over allowed only
    assert out.token_ids[2] in DIGITS and out.token_ids[3] in DIGITS
    assert out.token_ids[1] == out.token_ids[4] == out.token_ids[5] == TOKS.index("z")  # unguided rows
    raw = torch.log_softmax(logits[0], -1)
    assert out.logprobs[0].logprob == pytest.approx(float(raw[out.token_ids[0]]))  # raw distribution
    assert out.logprobs[0].top[0][0] == TOKS.index("z")
    # many sampled draws: never a disallowed token
    many = Sampler([EOS])(logits[2:3].expand(64, -1).clone(), [seq(SamplingParams(temperature=2.0))] * 64,
                          {i: tiny.compile(SamplingParams(guided_regex=r"\d")) for i in range(64)})
    assert set(many.token_ids) <= DIGITS and len(set(many.token_ids)) > 1


# --- slow: the embedded SmolLM2-135M-Instruct ---------------------------------------------------------

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "color": {"enum": ["red", "green", "blue"]},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 40},
                           "zip": {"type": "string", "pattern": r"^\d{5}$"}},
            "required": ["city", "zip"],
            "additionalProperties": False,
        },
        "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 30}, "minItems": 1, "maxItems": 3},
    },
    "required": ["name", "age", "color", "address", "hobbies"],
    "additionalProperties": False,
}
IM_END = "<|im_end|>"


def chat(engine: LLMEngine, q: str) -> list[int]:
    return engine.tokenizer.encode(engine.tokenizer.apply_chat_template([{"role": "user", "content": q}]))


@pytest.fixture(scope="module")
def engine(embedded) -> LLMEngine:
    return LLMEngine(embedded, EngineConfig(kv_cache_mb=256, max_num_batched_tokens=256))


@pytest.mark.slow
def test_json_schema_greedy_and_sampled(engine):
    p = chat(engine, "Describe a person named Alice as JSON: name, age, favorite color, address and hobbies.")
    outs = engine.generate([p, p, p], [
        SamplingParams(temperature=0.0, max_tokens=200, guided_json=PERSON),
        SamplingParams(temperature=1.0, seed=7, max_tokens=200, guided_json=PERSON),
        SamplingParams(temperature=1.0, seed=8, max_tokens=200, guided_json=PERSON),
    ])
    for out in outs:
        assert out.finish_reason == "stop", out.text
        jsonschema.validate(json.loads(out.text), PERSON)
        assert IM_END not in out.text
    assert outs[1].text != outs[2].text  # sampling really samples


@pytest.mark.slow
def test_json_object_and_eos_ends_cleanly(engine):
    prompts = [chat(engine, 'Return a JSON object with the keys "city" and "country" for Paris.'),
               chat(engine, "How many legs does a dog have? Answer with a number only.")]
    obj, num = engine.generate(prompts, [SamplingParams(temperature=0.0, max_tokens=96, guided_json_object=True),
                                         SamplingParams(temperature=0.0, max_tokens=16, guided_regex=r"\d+")])
    assert obj.finish_reason == "stop" and isinstance(json.loads(obj.text), dict)
    # `\d+` may always go on: the model ends it with EOS, which finishes cleanly and is not in the text
    assert num.finish_reason == "stop" and num.token_ids[-1] in engine.tokenizer.eos_token_ids
    assert re.fullmatch(r"\d+", num.text) and IM_END not in num.text


@pytest.mark.slow
def test_regex_and_lark_batched_with_unguided(engine):
    free = [chat(engine, "Write a sentence about trains."), chat(engine, "Name a famous painter.")]
    greedy = SamplingParams(temperature=0.0, max_tokens=20)
    alone = [o.token_ids for o in engine.generate(free, greedy)]
    lark = 'start: answer " " color\nanswer: "yes" | "no"\ncolor: "red" | "green" | "blue"'
    outs = engine.generate(
        [free[0], chat(engine, "What is your phone number?"), free[1], chat(engine, "Is the sky blue? Then a color.")],
        [greedy, SamplingParams(temperature=0.0, max_tokens=16, guided_regex=r"\d{3}-\d{4}"), greedy,
         SamplingParams(temperature=1.0, seed=1, max_tokens=16, guided_grammar=lark)])
    assert [outs[0].token_ids, outs[2].token_ids] == alone  # unguided rows are not constrained
    assert re.fullmatch(r"\d{3}-\d{4}", outs[1].text) and outs[1].finish_reason == "stop"
    assert re.fullmatch(r"(yes|no) (red|green|blue)", outs[3].text) and outs[3].finish_reason == "stop"


@pytest.mark.slow
def test_invalid_specs_are_rejected_before_queueing(engine):
    p = chat(engine, "Hi")
    for params, problem in [
        (SamplingParams(guided_json={"type": "nope"}), "nope"),
        (SamplingParams(guided_regex=r"(\d"), "unclosed group"),
        (SamplingParams(guided_grammar="start: missing_rule"), "missing_rule"),
        (SamplingParams(guided_json={"type": "object", "propertyNames": {"minLength": 1}}), "propertyNames"),
    ]:
        with pytest.raises(InvalidRequestError, match=problem):
            engine.add_request(p, params)
    assert engine.num_requests == 0 and not engine.has_unfinished()


@pytest.mark.slow
def test_max_tokens_cuts_guided_output(engine):
    # A too-small max_tokens ends the request with "length": the output is a valid PREFIX of the
    # grammar's language, not a complete match (here, JSON that does not parse yet).
    out = engine.generate([chat(engine, "Describe a person as JSON.")],
                          SamplingParams(temperature=0.0, max_tokens=8, guided_json=PERSON))[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 8
    assert out.text.startswith("{")
    with pytest.raises(ValueError):
        json.loads(out.text)


@pytest.mark.slow
def test_guided_survives_preemption(embedded, engine):
    # ~38 prompt + ~74 output tokens = 7 blocks each: 9 blocks hold one request, not both
    prompts = [chat(engine, f"Describe a person named {n} as JSON.") for n in ("Ann", "Bob")]
    params = SamplingParams(temperature=0.0, max_tokens=120, guided_json=PERSON)
    roomy = engine.generate(prompts, params)
    tiny = LLMEngine(embedded, EngineConfig(num_blocks=9, block_size=16, max_num_batched_tokens=128))
    squeezed = tiny.generate(prompts, params)
    assert tiny.scheduler.num_preemptions > 0
    assert [o.token_ids for o in squeezed] == [o.token_ids for o in roomy]
    for o in squeezed:
        assert o.finish_reason == "stop"
        jsonschema.validate(json.loads(o.text), PERSON)

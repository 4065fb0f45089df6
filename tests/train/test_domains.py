"""Shipped domains and the registry: generated data, splits, overrides, and every scorer on
hand-written completions (right, wrong, empty, the prompt echoed, padded)."""

import json
import math
import time

import jsonschema
import pytest

from mainspring.train.config import DomainSpec
from mainspring.train.domains.answer_style import TerseScorer, VerboseScorer
from mainspring.train.domains.base import Domain, DomainError, DomainSettings, Sample, Score, score_safely
from mainspring.train.domains.json_fields import BOOK_SCHEMA, PERSON_SCHEMA, check_schema
from mainspring.train.domains.registry import builtin_names, default_names, load_domain, load_domains
from mainspring.train.domains.scene_json import EXAMPLE

PURE = [n for n in builtin_names() if n != "code"]  # code needs the sandbox: test_code_domain.py


def load(name: str, seed: int = 0, **knobs) -> Domain:
    return load_domain(DomainSpec(name=name, **knobs), seed)


def sample_like(domain: Domain, **reference) -> Sample:
    """An eval sample of `domain` with its reference fields replaced."""
    s = domain.eval[0]
    return Sample(s.id, s.domain, s.messages, {**s.reference, **reference})


def test_names():
    assert set(builtin_names()) == {"json", "math", "code", "scene", "finance", "terse", "verbose"}
    assert set(default_names()) <= set(builtin_names()) and not {"terse", "verbose"} & set(default_names())


@pytest.mark.parametrize("name", PURE)
def test_generated_data_is_deterministic_and_splits_are_disjoint(name):
    a, b, other = load(name, 0), load(name, 0), load(name, 1)
    assert [s.messages for s in a.train] == [s.messages for s in b.train]
    assert [s.reference for s in a.eval] == [s.reference for s in b.eval]
    # the held-out set does not move with the seed; the training prompts do
    assert [s.messages for s in a.eval] == [s.messages for s in other.eval]
    assert [s.messages for s in a.train] != [s.messages for s in other.train]
    for d in (a, other):
        train_texts = {s.prompt_text for s in d.train}
        assert not train_texts & {s.prompt_text for s in d.eval}
        assert not {s.id for s in d.train} & {s.id for s in d.eval}
        assert len(train_texts) == len(d.train)
        assert all(s.domain == name and s.messages[-1]["role"] == "user" for s in d.train + d.eval)
    assert 1 <= a.settings.max_tokens <= 128 and 0 < a.settings.temperature <= 1.0


def test_overrides_and_caps():
    d = load("math", max_tokens=8, temperature=1.0, loss_weight=2.0, lr_scale=0.5, sampling_weight=3.0,
             train_size=10, eval_size=5)
    assert (d.settings.max_tokens, d.settings.temperature, d.settings.loss_weight, d.settings.lr_scale,
            d.settings.sampling_weight) == (8, 1.0, 2.0, 0.5, 3.0)
    assert len(d.train) == 10 and len(d.eval) == 5
    assert [s.id for s in d.eval] == [s.id for s in load("math").eval[:5]]
    untouched = load("math", temperature=0.0)
    assert untouched.settings.temperature == 0.0 and untouched.settings.max_tokens == load("math").settings.max_tokens


def test_unknown_domain_lists_the_known_ones():
    with pytest.raises(DomainError, match="unknown domain 'nope'.*json, math, code, scene, finance"):
        load("nope")
    with pytest.raises(DomainError, match="listed twice"):
        load_domains([DomainSpec(name="math"), DomainSpec(name="math")])


def test_scorer_override_on_a_shipped_domain():
    d = load("math", scorer="tests.train.scorers:constant")
    assert d.scorer.score(d.eval[0], "anything").total == 0.25


@pytest.mark.parametrize("name", PURE)
def test_an_echoed_prompt_scores_nothing(name):
    d = load(name)
    for s in d.eval:
        assert d.scorer.score(s, s.prompt_text).total == 0.0, s.prompt_text
        assert d.scorer.score(s, "").total == 0.0


# ---- math ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("reply, total", [
    ("8", 1.0), ("  8. \n", 1.0), ("4 + 4 = 8", 0.8), ("The answer is 8.", 0.8), ("7", 0.0),
    ("8 or maybe 9", 0.0), ("8.5", 0.0), ("", 0.0), ("eight", 0.0),
])
def test_math(reply, total):
    d = load("math")
    s = sample_like(d, answer=8)
    assert d.scorer.score(s, reply).total == pytest.approx(total)


# ---- json ---------------------------------------------------------------------------------------
PERSON = {"fields": {"name": "Maria", "age": 34, "city": "Lisbon"}, "schema": PERSON_SCHEMA}


@pytest.mark.parametrize("reply, total, parts", [
    ('{"name": "Maria", "age": 34, "city": "Lisbon"}', 1.0, {"parses": 1, "schema": 1, "fields": 1}),
    ('Sure!\n```json\n{"name": "maria", "age": 34, "city": "Lisbon"}\n```', 1.0, None),
    ('{"name": "Maria", "age": "34", "city": "Lisbon"}', 0.7, {"schema": 0, "fields": 1}),
    ('{"name": "Maria", "age": 34}', 0.2 + 0.5 * 2 / 3, {"schema": 0}),
    ('{"name": "Maria", "age": 34, "city": "Lisbon", "job": "x"}', 0.7, {"schema": 0}),
    ('{"name": "John", "age": 40, "city": "Oslo"}', 0.5, {"schema": 1, "fields": 0}),
    ('{"name": "Maria", "age": true, "city": "Lisbon"}', 0.2 + 0.5 * 2 / 3, None),
    ('{"name": "Maria", "age": 34, "city": "Lisbon",}', 0.0, {"parses": 0}),
    ("Maria, 34, Lisbon", 0.0, None), ("", 0.0, None),
])
def test_json(reply, total, parts):
    d = load("json")
    score = d.scorer.score(sample_like(d, **PERSON), reply)
    assert score.total == pytest.approx(total)
    for k, v in (parts or {}).items():
        assert score.parts[k] == pytest.approx(v)


@pytest.mark.parametrize("value", [
    {"name": "a", "age": 1, "city": "b"}, {"name": "a", "age": 1.0, "city": "b"},
    {"name": "a", "age": 1.5, "city": "b"},
    {"name": "a", "age": True, "city": "b"}, {"name": "a", "city": "b"}, {"name": 1, "age": 1, "city": "b"},
    {"name": "a", "age": 1, "city": "b", "x": 0}, {}, [], "x",
])
def test_check_schema_agrees_with_jsonschema(value):
    for schema in (PERSON_SCHEMA, BOOK_SCHEMA):
        assert (check_schema(value, schema) == []) == jsonschema.Draft202012Validator(schema).is_valid(value)


def test_json_generated_answers_score_one():
    d = load("json")
    for s in d.eval:
        assert d.scorer.score(s, json.dumps(s.reference["fields"])).total == 1.0


# ---- finance ------------------------------------------------------------------------------------
@pytest.mark.parametrize("reply, total", [
    ("33.3", 1.0), ("33.33%", 1.0), ("$33.3", 1.0), ("Growth was 33.3% in 2023.", 0.8), ("32.9", 0.0),
    ("1,250", 0.0), ("", 0.0), ("2023", 0.0),
])
def test_finance(reply, total):
    d = load("finance")
    s = sample_like(d, answer=33.3333, years=[2022, 2023], rtol=0.01)
    assert d.scorer.score(s, reply).total == pytest.approx(total)


def test_finance_thousands_and_tolerance():
    d = load("finance")
    s = sample_like(d, answer=1250.0, years=[2022, 2023], rtol=0.01)
    assert d.scorer.score(s, "1,250").total == 1.0
    assert d.scorer.score(s, "1,262").total == 1.0  # within 1%
    assert d.scorer.score(s, "1,270").total == 0.0
    for s in d.eval:
        assert d.scorer.score(s, f"{s.reference['answer']:.2f}").total == 1.0


# ---- scene --------------------------------------------------------------------------------------
def _scene(objects):
    return {"schema": "scene/0.1", "objects": objects, "camera": {"position": [0, 2, 5], "look_at": [0, 0, 0]}}


BALL_ON_BOX = {"objects": [{"id": "ball", "shape": "sphere", "colour": "red"},
                           {"id": "box", "shape": "box", "colour": "blue"}],
               "relation": {"a": "ball", "b": "box", "kind": "above"}}
BALL = {"id": "ball", "shape": "sphere", "radius": 0.5, "position": [0, 1.5, 0], "material": {"color": [0.9, 0.1, 0]}}
BOX = {"id": "box", "shape": "box", "size": [1, 1, 1], "position": [0, 0.5, 0], "material": {"color": [0, 0, 1]}}


@pytest.mark.parametrize("doc, total", [
    (_scene([BALL, BOX]), 1.0),
    ({**_scene([{**BALL, "material": "shiny"}, BOX]), "materials": {"shiny": {"color": [1, 0, 0]}}}, 1.0),
    (_scene([{**BALL, "position": [0, 0, 0]}, BOX]), 0.1 + 0.15 + 0.35 + 0.4 * 4 / 5),  # not above
    (_scene([{**BALL, "material": {"color": [0, 1, 0]}}, BOX]), 0.1 + 0.15 + 0.35 + 0.4 * 4 / 5),  # green
    (_scene([{**BALL, "radius": -1}, BOX]), 0.1 + 0.15 + 0.35 * 0.25 + 0.4),  # invalid ball, brief still met
    (_scene([BALL]), 0.1 + 0.15 + 0.35 * 0.5 + 0.4 * 2 / 5),  # the box is missing
    ({"objects": [BALL, BOX]}, 0.1 + 0.15 * 1 / 3 + 0.35 * 0.5 + 0.4),  # no schema, no camera
    (EXAMPLE, 0.25),  # the system message's example, copied
])
def test_scene(doc, total):
    d = load("scene")
    score = d.scorer.score(sample_like(d, **BALL_ON_BOX), "Here it is:\n```json\n" + json.dumps(doc) + "\n```")
    assert score.total == pytest.approx(total)


def test_scene_garbage():
    d = load("scene")
    s = sample_like(d, **BALL_ON_BOX)
    assert d.scorer.score(s, '{"schema": "scene/0.1", "objects": [').total == 0.0
    assert d.scorer.score(s, '{"title": "ball"}').total == pytest.approx(0.1)
    assert d.scorer.score(s, '{"objects": "ball"}').total == pytest.approx(0.1 + 0.05)


# ---- terse and verbose --------------------------------------------------------------------------
def test_terse_and_verbose_conflict():
    terse, verbose = load("terse"), load("verbose")
    # the same held-out questions, worded alike but for the instruction
    assert [s.reference["question"] for s in terse.eval] == [s.reference["question"] for s in verbose.eval]
    t = next(s for s in terse.train + terse.eval if s.reference["question"] == "What is the capital of France?")
    v = Sample(t.id, "verbose", t.messages, t.reference)
    word, sentence = "Paris", "The capital of France is Paris."
    assert TerseScorer().score(t, word).total == 1.0 and TerseScorer().score(t, "Paris.").total == 1.0
    assert TerseScorer().score(t, sentence).total == pytest.approx(0.7 / 6 + 0.3)
    assert TerseScorer().score(t, "London").total == pytest.approx(0.7)
    assert VerboseScorer().score(v, sentence).total == 1.0
    assert VerboseScorer().score(v, "Paris").total == pytest.approx(0.4 / 6 + 0.3)
    assert VerboseScorer().score(v, "The capital of France is a lovely city").total == pytest.approx(0.4)
    assert VerboseScorer().score(v, "What is the capital of France? I think it is Paris.").total == 0.0


# ---- score_safely -------------------------------------------------------------------------------
class _Raises:
    def score(self, sample, completion):
        raise KeyError("answer")


class _Sleeps:
    def score(self, sample, completion):
        time.sleep(1.0)
        return Score(1.0)


class _Returns:
    def __init__(self, value):
        self.value = value

    def score(self, sample, completion):
        return self.value


@pytest.mark.parametrize("scorer, error", [
    (_Raises(), "scorer raised KeyError: 'answer'"),
    (_Sleeps(), "scorer timed out after 0.2 s"),
    (_Returns(Score(math.nan)), "non-finite total nan"),
    (_Returns(0.5), "scorer returned float, not Score"),
])
def test_score_safely_turns_failures_into_zeros(scorer, error):
    s = Sample("x", "d", ({"role": "user", "content": "hi"},))
    out = score_safely(scorer, s, "reply", timeout_s=0.2)
    assert out.total == 0.0 and error in out.error


def test_score_safely_clamps_and_drops_bad_parts():
    s = Sample("x", "d", ({"role": "user", "content": "hi"},))
    out = score_safely(_Returns(Score(1.5, {"a": 0.5, "b": math.inf})), s, "reply")
    assert out.total == 1.0 and out.parts == {"a": 0.5} and out.error is None


def test_domain_contract_errors():
    s = Sample("a", "d", ({"role": "user", "content": "hi"},))
    with pytest.raises(DomainError, match="eval split is empty"):
        Domain("d", [s], [], _Raises())
    with pytest.raises(DomainError, match="in both train and eval"):
        Domain("d", [s], [s], _Raises(), DomainSettings())

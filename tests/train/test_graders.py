"""OpenAI RFT graders: each type on passing and failing samples, templates, the python grader in the real
sandbox, multi-grader arithmetic (and what it refuses), and a job's data files as a training Domain."""

from __future__ import annotations

import json
import math

import pytest

from mainspring.train.domains.base import Sample, score_safely
from mainspring.train.formula import FormulaError, parse_formula
from mainspring.train.graders import GradeFailed, GraderError, GraderScorer, evaluate, parse_grader
from mainspring.train.rft_data import DataFileError, job_domain
from mainspring.train.similarity import bleu, fuzzy_match, gleu, rouge_l, rouge_n

OUT, ANSWER = "{{ sample.output_text }}", "{{ item.answer }}"


def check(op: str, reference: str = ANSWER) -> dict:
    return {"type": "string_check", "name": "exact", "input": OUT, "reference": reference, "operation": op}


def similar(metric: str) -> dict:
    return {"type": "text_similarity", "name": "sim", "input": OUT, "reference": ANSWER, "evaluation_metric": metric}


def score(raw: dict, output: str, item: dict | None = None, sandbox=None) -> float:
    return evaluate(parse_grader(raw), output, item or {"answer": "Paris"}, sandbox).score


# ---- string_check --------------------------------------------------------------------------------------
@pytest.mark.parametrize("op,output,expected", [
    ("eq", "Paris", 1.0), ("eq", "paris", 0.0), ("ne", "Lyon", 1.0), ("ne", "Paris", 0.0),
    ("like", "It is Paris.", 1.0), ("like", "It is paris.", 0.0), ("ilike", "IT IS PARIS", 1.0), ("ilike", "Lyon", 0.0),
])
def test_string_check_operations(op, output, expected):
    assert score(check(op), output) == expected


def test_templates_reach_nested_fields_lists_and_json_output():
    item = {"answer": {"city": "Paris", "aliases": ["Lutetia", "City of Light"]}}
    assert score(check("eq", "{{ item.answer.aliases[1] }}"), "City of Light", item) == 1.0
    json_out = {**check("eq", "{{item.answer.city}}"), "input": "{{ sample.output_json.city }}"}
    assert score(json_out, '{"city": "Paris"}', item) == 1.0
    with pytest.raises(GradeFailed, match="no such field"):  # not JSON: output_json is null
        score(json_out, "Paris", item)
    with pytest.raises(GradeFailed, match="no such field"):
        score(check("eq", "{{ item.missing }}"), "Paris")
    # a non-string field is compared as its JSON
    assert score(check("eq", "{{ item.n }}"), "42", {"n": 42}) == 1.0


# ---- text_similarity -----------------------------------------------------------------------------------
def test_similarity_metrics_rank_close_answers_above_far_ones():
    ref = "the quick brown fox jumps over the lazy dog"
    close, far = "the quick brown fox jumped over the lazy dog", "an entirely different sentence about cats"
    for metric in (fuzzy_match, bleu, gleu, rouge_l, lambda a, b: rouge_n(a, b, 1), lambda a, b: rouge_n(a, b, 2)):
        assert metric(ref, ref) == pytest.approx(1.0)
        assert 0.0 <= metric(far, ref) < metric(close, ref) < 1.0
    assert bleu("", ref) == 0.0 and rouge_l("", ref) == 0.0


def test_bleu_and_rouge_match_hand_computed_values():
    # rouge_1: 3 shared unigrams, P = 3/4, R = 3/3 -> F1 = 6/7
    assert rouge_n("the cat sat down", "the cat sat", 1) == pytest.approx(6 / 7)
    # rouge_l: LCS "a c d" = 3 of 4 and 3 of 4 -> 0.75
    assert rouge_l("a b c d", "a c d e") == pytest.approx(0.75)
    # bleu of 3 tokens vs 4: order 3, p1 = 3/3, p2 = (2+1)/(2+1), p3 = (1+1)/(1+1), brevity exp(1 - 4/3)
    assert bleu("a b c", "a b c d") == pytest.approx(math.exp(1 - 4 / 3))


@pytest.mark.slow
def test_cosine_uses_the_embedding_model():
    assert score(similar("cosine"), "Paris is the capital of France.",
                 {"answer": "The capital of France is Paris."}) > 0.9
    assert score(similar("cosine"), "I like turtles", {"answer": "The capital of France is Paris."}) < 0.3


def test_text_similarity_grader_scores_the_rendered_templates():
    assert score(similar("fuzzy_match"), "Paris") == 1.0
    assert 0.0 < score(similar("fuzzy_match"), "Parus") < 1.0
    assert score(similar("rouge_1"), "London") == 0.0


# ---- python --------------------------------------------------------------------------------------------
PY = """
def grade(sample, item):
    text = sample["output_text"].strip().lower()
    print("graders may print")  # the harness ignores it
    return 1.0 if text == item["answer"].lower() else 0.25
"""


def python_grader(source: str = PY) -> dict:
    return {"type": "python", "name": "py", "source": source}


def test_python_grader_runs_in_the_sandbox(sandbox):
    assert score(python_grader(), " PARIS ", sandbox=sandbox) == 1.0
    assert score(python_grader(), "Lyon", sandbox=sandbox) == 0.25


@pytest.mark.parametrize("source,reason", [
    ("def grade(sample, item):\n    raise ValueError('bad item')\n", "ValueError: bad item"),
    ("def grade(sample, item):\n    return 'high'\n", "returned str"),
    ("def grade(sample, item):\n    return float('nan')\n", "non-finite"),
    ("import socket\ndef grade(sample, item):\n    socket.create_connection(('1.1.1.1', 80), timeout=2)\n"
     "    return 1.0\n", "python grader raised"),
    ("def grade(sample, item):\n    while True: pass\n", "limit"),
])
def test_python_grader_failures_are_reasons_not_crashes(sandbox, source, reason):
    with pytest.raises(GradeFailed, match=reason):
        score(python_grader(source), "Paris", sandbox=sandbox)


def test_python_grader_memory_is_limited(sandbox):
    hog = "def grade(sample, item):\n    b = bytearray(2 << 30)\n    return 1.0\n"
    with pytest.raises(GradeFailed, match="MemoryError|memory"):
        score(python_grader(hog), "Paris", sandbox=sandbox)


# ---- multi ---------------------------------------------------------------------------------------------
def multi(formula: str, graders: dict | None = None) -> dict:
    graders = graders if graders is not None else {"exact": check("eq"), "loose": {**check("ilike"), "name": "loose"},
                                                    "sim": similar("fuzzy_match")}
    return {"type": "multi", "name": "combined", "graders": graders, "calculate_output": formula}


def test_multi_grader_combines_named_scores():
    g = parse_grader(multi("0.5 * exact + 0.25 * loose + 0.25 * sim"))
    assert evaluate(g, "Paris", {"answer": "Paris"}).score == pytest.approx(1.0)
    partial = evaluate(g, "paris!", {"answer": "Paris"})
    assert partial.parts["exact"] == 0.0 and partial.parts["loose"] == 1.0
    assert partial.score == pytest.approx(0.25 + 0.25 * partial.parts["sim"])


@pytest.mark.parametrize("formula,expected", [
    ("min(exact, loose)", 0.0), ("max(exact, loose, sim)", 1.0), ("(exact + loose) / 2", 0.5),
    ("loose ^ 2 + abs(-0.5) * floor(1.7)", 1.5), ("sqrt(4 * loose) - exp(0) + log(1) + ceil(0.2)", 2.0),
    ("-exact + 1", 1.0), ("2 ** 3", 8.0),
])
def test_multi_formula_arithmetic(formula, expected):
    g = parse_grader(multi(formula))
    assert evaluate(g, "xx Paris", {"answer": "Paris"}).score == pytest.approx(expected)


@pytest.mark.parametrize("formula,reason", [
    ("__import__('os').system('true')", "functions allowed"), ("exact.__class__", "not allowed"),
    ("[exact][0]", "not allowed"), ("exact if loose else sim", "not allowed"), ("unknown + 1", "not one of"),
    ("exact +", "not an arithmetic expression"), ("'a' * 3", "only numbers"), ("min(exact)", "takes 2 to 32"),
    ("lambda: 1", "not allowed"), ("", "empty"), ("1" * 1001, "longer than"), ("exact < loose", "not allowed"),
])
def test_multi_formula_refuses_anything_but_arithmetic(formula, reason):
    with pytest.raises(GraderError, match=reason):
        parse_grader(multi(formula))


def test_multi_formula_math_errors_fail_the_sample_not_the_run():
    g = parse_grader(multi("loose / exact"))
    with pytest.raises(GradeFailed, match="division by zero"):
        evaluate(g, "paris", {"answer": "Paris"})
    with pytest.raises(FormulaError, match="gave|failed"):
        parse_formula("9.0 ^ 9 ^ 9", set()).evaluate({})
    with pytest.raises(FormulaError):
        parse_formula("(0 - 1) ^ 0.5", set()).evaluate({})


# ---- what is refused ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("raw,reason", [
    ({"type": "score_model", "name": "judge", "model": "gpt-4o", "input": []}, "need a judge model"),
    ({"type": "label_model", "name": "judge"}, "need a judge model"),
    ({"type": "regex", "name": "x"}, "unknown grader type"),
    ("string_check", "JSON object"),
    ({**check("eq"), "operation": "contains"}, "operation"),
    ({**check("eq"), "input": "{{ output_text }}"}, "not of the form"),
    ({**check("eq"), "input": "{{ env.HOME }}"}, "not of the form"),
    ({**check("eq"), "extra": 1}, "Extra inputs"),
    ({k: v for k, v in check("eq").items() if k != "reference"}, "reference: Field required"),
    (similar("meteor"), "not supported by this server"),
    (similar("bertscore"), "unknown evaluation_metric"),
    (python_grader("def score(sample, item):\n    return 1\n"), "must define a top-level function grade"),
    (python_grader("def grade(:\n"), "does not parse"),
    (python_grader("x = 1\n" * 50_000), "larger than"),
    (multi("a", {"a": multi("1")}), "cannot contain another multi"),
    (multi("a", {"a": {"type": "score_model", "name": "j"}}), r"graders\.a: score_model"),
    (multi("a", {"a-b": check("eq")}), "must be an identifier"),
    (multi("1", {}), "at least 1"),
])
def test_bad_graders_are_rejected_with_the_reason(raw, reason):
    with pytest.raises(GraderError, match=reason):
        parse_grader(raw)


# ---- as a training scorer and domain ---------------------------------------------------------------------
def test_grader_scorer_is_a_scorer_with_parts_and_reasons():
    scorer = GraderScorer(parse_grader(multi("0.5 * exact + 0.5 * sim")))
    sample = Sample("t1", "job", ({"role": "user", "content": "Capital of France?"},), {"answer": "Paris"})
    good = score_safely(scorer, sample, "Paris")
    assert good.total == 1.0 and good.parts == {"exact": 1.0, "loose": 1.0, "sim": 1.0} and good.error is None
    missing = score_safely(GraderScorer(parse_grader(check("eq", "{{ item.nope }}"))), sample, "Paris")
    assert missing.total == 0.0 and "no such field" in missing.error
    # the item also holds the messages, as OpenAI's item namespace holds the whole line
    by_prompt = GraderScorer(parse_grader(check("like", "{{ item.messages[0].content }}")))
    assert by_prompt.score(sample, "Capital of France? Paris").total == 1.0


def jsonl(path, lines):
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


def line(q: str, a: str, **extra) -> dict:
    return {"messages": [{"role": "developer", "content": "Answer in one word."}, {"role": "user", "content": q}],
            "answer": a, **extra}


def test_job_domain_from_training_and_validation_files(tmp_path):
    train = jsonl(tmp_path / "train.jsonl", [line(f"q{i}", f"a{i}", level=i) for i in range(5)] + [""])
    valid = jsonl(tmp_path / "valid.jsonl", [line("vq", "va")])
    d = job_domain("job", train, valid, parse_grader(check("eq")))
    assert [s.id for s in d.train] == [f"train-{i}" for i in range(1, 6)] and [s.id for s in d.eval] == ["valid-1"]
    assert d.train[2].reference == {"answer": "a2", "level": 2}
    assert d.train[0].messages[0] == {"role": "system", "content": "Answer in one word."}  # developer -> system
    assert d.scorer.score(d.train[0], "a0").total == 1.0


def test_without_a_validation_file_a_stable_tenth_is_held_out(tmp_path):
    train = jsonl(tmp_path / "train.jsonl", [line(f"q{i}", f"a{i}") for i in range(30)])
    a = job_domain("job", train, None, parse_grader(check("eq")))
    b = job_domain("job", train, None, parse_grader(check("eq")))
    assert len(a.eval) == 3 and len(a.train) == 27
    assert [s.id for s in a.eval] == [s.id for s in b.eval]


@pytest.mark.parametrize("lines,reason", [
    (["not json"], "line 1 is not valid JSON"),
    ([line("q", "a"), "[1, 2]"], "line 2 is not a JSON object"),
    ([{"answer": "a"}], "no `messages`"),
    ([{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}], "last message"),
    ([{"messages": [{"role": "robot", "content": "q"}]}], "role"),
    ([{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}], "only text"),
    ([line("q", "a")], "at least 2 lines"),
    ([], "has no lines"),
])
def test_bad_data_files_name_the_line(tmp_path, lines, reason):
    train = jsonl(tmp_path / "train.jsonl", lines)
    with pytest.raises(DataFileError, match=reason) as exc:
        job_domain("job", train, None, parse_grader(check("eq")))
    assert exc.value.param == "training_file"

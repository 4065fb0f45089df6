"""pass@k: the unbiased estimator against the binomial formula (k = 1..n, c = 0, c = n, known values), and the
HumanEval-style functions scored in the real sandbox: canonical solutions pass, wrong, crashing and looping
samples fail alone, a ChatModel's fenced reply is a completion."""

from __future__ import annotations

import itertools
from math import comb

import pytest

from mainspring.scenarios.coding.humaneval import (chat_completer, evaluate_passk, extract_code, load_problems,
                                                   run_samples)
from mainspring.scenarios.coding.passk import mean_pass_at_k, pass_at_k
from tests.scenarios.coding.embedded_http import embedded_http, served_model
from tests.scripted_model import ScriptedModel

PROBLEMS = load_problems()


def test_pass_at_k_is_one_minus_the_chance_that_k_draws_miss():
    for n in range(1, 9):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(1 - comb(n - c, k) / comb(n, k)), (n, c, k)
            assert pass_at_k(n, c, 1) == pytest.approx(c / n)
            values = [pass_at_k(n, c, k) for k in range(1, n + 1)]
            assert values == sorted(values)  # more draws never lower the chance


def test_pass_at_k_edges_and_known_values():
    assert all(pass_at_k(10, 0, k) == 0.0 for k in range(1, 11))
    assert all(pass_at_k(10, 10, k) == 1.0 for k in range(1, 11))
    assert pass_at_k(10, 3, 5) == pytest.approx(1 - 21 / 252)  # C(7,5) / C(10,5)
    assert pass_at_k(200, 1, 100) == pytest.approx(0.5)
    assert pass_at_k(5, 4, 2) == 1.0  # one wrong sample cannot fill two draws
    assert mean_pass_at_k([(4, 1), (4, 3)], 1) == pytest.approx(0.5)
    for bad in ((0, 0, 1), (5, 6, 1), (5, -1, 1), (5, 2, 0), (5, 2, 6)):
        with pytest.raises(ValueError):
            pass_at_k(*bad)


def test_the_problems_are_humaneval_shaped():
    assert len(PROBLEMS) == 10 and len({p.task_id for p in PROBLEMS}) == 10
    for p in PROBLEMS:
        assert p.prompt.startswith(f"def {p.entry_point}(") and '"""' in p.prompt
        assert "def check(candidate):" in p.test and p.entry_point not in p.test


def test_canonical_solutions_pass_and_wrong_ones_fail_in_the_sandbox(sandbox):
    answers = itertools.cycle(["canonical", "    return None\n", "    raise RuntimeError('no')\n"])
    by_prompt = {p.prompt: p for p in PROBLEMS}

    def complete(prompt: str) -> str:
        answer = next(answers)
        return by_prompt[prompt].canonical_solution if answer == "canonical" else answer

    report = evaluate_passk(complete, n=3, ks=(1, 2, 3), sandbox=sandbox)
    assert [(r.n, r.c) for r in report.results] == [(3, 1)] * 10
    assert report.pass_at(1) == pytest.approx(1 / 3)
    assert report.pass_at(2) == pytest.approx(2 / 3)
    assert report.pass_at(3) == 1.0
    assert all(len(r.errors) == 2 for r in report.results)
    assert any("RuntimeError" in e for e in report.results[0].errors)
    summary = report.to_dict()
    assert summary["pass@3"] == 1.0 and summary["results"][0]["c"] == 1
    assert "pass@1 0.333" in report.render()
    with pytest.raises(ValueError):
        evaluate_passk(complete, n=2, ks=(3,), sandbox=sandbox)


def test_a_looping_sample_fails_alone(sandbox):
    problem = PROBLEMS[0]
    result = run_samples(problem, ["    while True:\n        pass\n", problem.canonical_solution], sandbox=sandbox,
                         timeout_s=1.0)
    assert result.passed == [False, True]
    assert "timed out" in result.errors[0]


def test_a_chat_models_fenced_reply_is_a_completion(sandbox):
    problem = next(p for p in PROBLEMS if p.entry_point == "digital_root")
    whole = "def digital_root(n: int) -> int:\n" + problem.canonical_solution
    model = ScriptedModel([f"Here it is:\n```python\n{whole}```\nDone.", "```python\ndef digital_root(n):\n"
                           "    return n\n```"])
    report = evaluate_passk(chat_completer(model, temperature=0.2), [problem], n=2, sandbox=sandbox)
    assert report.results[0].passed == [True, False]
    assert model.calls[0]["messages"][1]["content"] == problem.prompt and model.calls[0]["temperature"] == 0.2
    assert extract_code("no fence") == "no fence\n"


@pytest.fixture(scope="module")
def embedded_server(embedded, tmp_path_factory):
    with embedded_http(embedded, tmp_path_factory.mktemp("passk-api")) as srv:
        yield srv


@pytest.mark.slow
def test_the_embedded_model_samples_over_http_and_is_scored(sandbox, embedded_server):
    """SmolLM2-135M through the OpenAI-compatible API: whatever it writes is run and counted (it need not pass)."""
    from mainspring.models import OpenAICompatibleModel

    served = served_model(embedded_server)
    model = OpenAICompatibleModel(embedded_server.openai_url, api_key="x", model=served, timeout=300, max_retries=0)
    report = evaluate_passk(chat_completer(model, max_tokens=96), PROBLEMS[:2], n=2, ks=(1, 2), sandbox=sandbox)
    assert [r.n for r in report.results] == [2, 2]
    assert all(len(r.errors) == r.n - r.c for r in report.results)
    assert 0.0 <= report.pass_at(1) <= report.pass_at(2) <= 1.0
    print(report.render())

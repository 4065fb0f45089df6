"""The code domain: hidden unit tests run in the real sandbox (the shared `sandbox` fixture)."""

import pytest

from mainspring.config import Settings
from mainspring.sandbox import Sandbox
from mainspring.train.config import DomainSpec
from mainspring.train.domains.base import DomainError
from mainspring.train.domains.code_tasks import TASKS
from mainspring.train.domains.python_functions import extract_code, prompt
from mainspring.train.domains.registry import load_domain
from tests.sandbox.conftest import TEST_SANDBOX_DIR


@pytest.fixture(scope="module")
def code(sandbox):
    return load_domain(DomainSpec(name="code"), 0, sandbox=sandbox)


def task_sample(code, function):
    return next(s for s in code.train + code.eval if s.reference["function"] == function)


def test_tasks_and_splits(code):
    assert 20 <= len(TASKS) <= 40 and len({t.function for t in TASKS}) == len(TASKS)
    for t in TASKS:
        assert t.example not in t.tests and len(t.tests) >= 4  # what the prompt shows is not what is scored
        assert t.example in prompt(t) and not any(test in prompt(t) for test in t.tests)
    assert not {s.prompt_text for s in code.train} & {s.prompt_text for s in code.eval}
    again = load_domain(DomainSpec(name="code"), 0, sandbox=code.scorer.sandbox)
    assert [s.id for s in again.eval] == [s.id for s in code.eval]


@pytest.mark.parametrize("reply, total, compiles", [
    ("```python\ndef add(a, b):\n    return a + b\n```", 1.0, 1.0),
    ("Here you go:\n```python\ndef add(a, b):\n    return a + b\n```\nIt adds a and b.", 1.0, 1.0),
    ("def add(a, b):\n    return a + b\n\nThis function returns the sum of", 1.0, 1.0),  # prose after the code
    ("   def add(a, b):\n       return a + b", 1.0, 1.0),  # indented as a whole
    ("def add(a, b):\n    return a - b", 0.25, 1.0),  # right only for add(0, 0)
    ("def plus(a, b):\n    return a + b", 0.0, 1.0),  # the wrong name
    ("def add(a, b):\n    while True:\n        pass", 0.0, 1.0),
    ("import sys\nsys.exit(0)", 0.0, 1.0),
    ("import json\nprint(json.dumps({'passed': 4, 'total': 4}))\ndef add(a, b):\n    return 0", 0.5, 1.0),
    ("x = 'a' * (10 ** 10)\ndef add(a, b):\n    return a + b", 0.0, 1.0),  # over the memory limit
    ("The sum of a and b is a + b.", 0.0, 0.0),
    ("", 0.0, 0.0),
])
def test_scorer(code, reply, total, compiles):
    score = code.scorer.score(task_sample(code, "add"), reply)
    assert score.total == pytest.approx(total) and score.parts == {"compiles": compiles, "tests_passed": total}


def test_echoed_prompts_and_reference_solutions(code):
    add = task_sample(code, "add")
    assert code.scorer.score(add, add.prompt_text).total == 0.0
    solution = "def reverse_string(s):\n    return s[::-1]"
    assert code.scorer.score(task_sample(code, "reverse_string"), solution).total == 1.0


def test_extract_code_prefers_a_fence_defining_the_function():
    reply = "```python\nimport math\n```\nthen\n```python\ndef f(x):\n    return x\n```"
    assert extract_code(reply, "f") == "def f(x):\n    return x\n"
    assert extract_code("```python\ndef f(x):\n    return (x", "f") is None
    assert extract_code("def f(x):\n    return x\ndef g(", "f") == "def f(x):\n    return x"  # cut off by max_tokens


def test_unavailable_sandbox_is_a_load_error():
    nowhere = Sandbox(Settings(sandbox_dir=TEST_SANDBOX_DIR, sandbox_bwrap="/nonexistent/bwrap",
                               sandbox_insecure_local=False))
    with pytest.raises(DomainError, match="domain 'code' runs unit tests in the sandbox.*bubblewrap"):
        load_domain(DomainSpec(name="code"), 0, sandbox=nowhere)

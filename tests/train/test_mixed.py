"""Mixed prompts: a tag wins, untagged prompts are routed by the MiniLM router to the right domain's scorer."""

import json

import pytest

from mainspring.train.config import DomainSpec
from mainspring.train.domains.base import DomainError
from mainspring.train.domains.registry import load_domains
from mainspring.train.mixed import add_mixed

pytestmark = pytest.mark.slow  # loads MiniLM and fits the router


def test_tagged_lines_keep_their_tag_and_untagged_ones_are_routed(tmp_path):
    lines = [
        {"id": "t1", "domain": "json", "prompt": "Compute 9 - 4. Reply with just the number.", "answer": 5,
         "split": "train"},  # tagged json although it reads like math: the tag wins
        {"id": "u1", "prompt": "Compute 6 + 2. Reply with just the number.", "answer": 8, "split": "train"},
        {"id": "u2", "prompt": "What is 7 - 5? Reply with just the number.", "answer": 2, "split": "eval"},
        {"id": "u3", "prompt": 'Reply with a JSON object with the keys "name", "age", "city" for this text: '
                               "Ada is 36 years old and lives in London.", "split": "train",
         "fields": {"name": "Ada", "age": 36, "city": "London"}},
    ]
    path = tmp_path / "mixed.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines))
    domains = load_domains([DomainSpec(name="json", train_size=32), DomainSpec(name="math", train_size=32)])
    n_math = len(domains["math"].train)
    report = add_mixed(path, domains)
    assert report.tagged == 1 and report.routed == {"math": 2, "json": 1}
    assert report.router["accuracy"] >= 0.95
    assert "mixed:t1" in {s.id for s in domains["json"].train}
    assert len(domains["math"].train) == n_math + 1 and domains["math"].eval[-1].id == "mixed:u2"
    routed = domains["math"].train[-1]
    assert routed.domain == "math" and domains["math"].scorer.score(routed, "8").total == 1.0


def test_a_tag_outside_the_run_is_an_error(tmp_path):
    path = tmp_path / "mixed.jsonl"
    path.write_text(json.dumps({"domain": "poetry", "prompt": "A haiku", "split": "train"}) + "\n")
    with pytest.raises(DomainError, match="poetry"):
        add_mixed(path, load_domains([DomainSpec(name="math", train_size=8)]))

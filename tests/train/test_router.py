"""The domain router on the shipped domains: tags win, the MiniLM classifier routes the rest.

Measured: fitted on 64 train prompts per domain (28 for code), 1.00 held-out accuracy on the
default domains' 264 eval prompts, lowest confidence 0.95; fitted on every train prompt, also 1.00,
and 1.00 on terse / verbose / math (which differ in one phrase). The thresholds below leave room
for another CPU's float rounding, not for a worse classifier."""

import pytest
import torch

from mainspring.embeddings import EmbeddingModel
from mainspring.train.config import DomainSpec
from mainspring.train.domains.base import DomainError, Sample
from mainspring.train.domains.registry import default_names, load_domain
from mainspring.train.router import DomainRouter

pytestmark = pytest.mark.slow  # loads MiniLM and embeds a few hundred prompts

TRAIN_CAP = 64  # prompts per domain to fit on: keeps the file to seconds on two cores


@pytest.fixture(scope="module")
def embedder():
    return EmbeddingModel.load()


@pytest.fixture(scope="module")
def domains(request):
    names = list(default_names())
    try:
        sandbox = request.getfixturevalue("sandbox")
    except pytest.skip.Exception:  # no sandbox on this host: route among the other domains
        names.remove("code")
        sandbox = None
    return {n: load_domain(DomainSpec(name=n, train_size=TRAIN_CAP), 0, sandbox=sandbox) for n in names}


@pytest.fixture(scope="module")
def router(domains, embedder):
    return DomainRouter.fit(domains, seed=0, embedder=embedder)


def test_held_out_accuracy(router, domains):
    report = router.eval_report(domains)
    assert report.n == sum(len(d.eval) for d in domains.values())
    assert report.accuracy >= 0.97, report.mistakes
    assert min(report.per_domain.values()) >= 0.9, report.per_domain
    for truth, row in report.confusion.items():
        assert sum(row.values()) == len(domains[truth].eval)
    assert report.to_dict()["accuracy"] == report.accuracy


def test_tag_wins_over_the_classifier(router, domains):
    json_prompt = domains["json"].eval[0]
    tagged_math = Sample("x", "math", json_prompt.messages)
    assert router.route(tagged_math) == ("math", 1.0)
    untagged = Sample("x", "", json_prompt.messages)
    name, confidence = router.route(untagged)
    assert name == "json" and 0.5 < confidence < 1.0
    assert router.route(json_prompt.prompt_text)[0] == "json"
    with pytest.raises(DomainError, match="tagged 'cooking', which is not a domain of this run"):
        router.route(Sample("y", "cooking", json_prompt.messages))


def test_route_many_keeps_order(router, domains):
    items = [domains["finance"].eval[0].prompt_text, Sample("t", "scene", domains["math"].eval[0].messages),
             domains["math"].eval[1].prompt_text]
    assert [name for name, _ in router.route_many(items)] == ["finance", "scene", "math"]


def test_fit_is_deterministic(domains, embedder):
    small = {n: load_domain(DomainSpec(name=n, train_size=12, eval_size=4)) for n in ("math", "json")}
    a, b = (DomainRouter.fit(small, seed=3, embedder=embedder, steps=50) for _ in range(2))
    assert torch.equal(a.weight, b.weight) and torch.equal(a.bias, b.bias)
    with pytest.raises(DomainError, match="at least two domains"):
        DomainRouter.fit({"math": small["math"]}, embedder=embedder)

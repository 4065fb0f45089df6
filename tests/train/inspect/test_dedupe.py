"""Exact and near duplicates within a split: clean shipped domains, planted copies of each kind."""

from __future__ import annotations

import dataclasses
import random

import pytest

from mainspring.train.config import DomainSpec
from mainspring.train.domains.base import Domain, Sample, Score
from mainspring.train.domains.registry import builtin_names, load_domain
from mainspring.train.inspect.dedupe import TextIndex, check_duplicates, normalize
from mainspring.train.inspect.findings import InspectOptions

OPTS = InspectOptions(use_embeddings=False)


class Zero:
    def score(self, sample: Sample, completion: str) -> Score:
        return Score(0.0)


def sample(i: str, text: str, ref: dict | None = None, domain: str = "t") -> Sample:
    return Sample(i, domain, ({"role": "user", "content": text},), ref if ref is not None else {"answer": i})


def with_text(s: Sample, new_id: str, text: str) -> Sample:
    return dataclasses.replace(s, id=new_id, messages=({"role": "user", "content": text},))


def edited(text: str, kind: str, rng: random.Random) -> str:
    """One word edit at a random place: substitution by a new word, deletion, insertion, or a swap."""
    words = text.split()
    i = rng.randrange(1, len(words) - 1)
    if kind == "sub":
        words[i] = "zebrafish"
    elif kind == "del":
        del words[i]
    elif kind == "ins":
        words.insert(i, "really")
    else:
        words[i], words[i + 1] = words[i + 1], words[i]
    return " ".join(words)


def planted(domain: Domain, seed: int = 0) -> tuple[Domain, list[tuple[str, str]]]:
    """A copy of `domain` with four near copies of train items (one per edit kind) added to train."""
    rng = random.Random(seed)
    train = list(domain.train)
    pairs = []
    for n, kind in enumerate(("sub", "del", "ins", "swap")):
        src = max(train[n * 7:n * 7 + 7], key=lambda s: len(s.prompt_text.split()))
        copy = with_text(src, f"{src.id}-{kind}", edited(src.prompt_text, kind, rng))
        train.append(copy)
        pairs.append((src.id, copy.id))
    return dataclasses.replace(domain, train=train, eval=list(domain.eval)), pairs


@pytest.mark.parametrize("name", builtin_names())
def test_shipped_domains_have_no_duplicate_errors(name: str) -> None:
    findings = check_duplicates(load_domain(DomainSpec(name=name)), OPTS)
    assert not [f for f in findings if f.severity == "error"]
    assert not [f for f in findings if f.check == "data.exact_duplicates"]


@pytest.mark.parametrize("name", ["json", "math", "scene", "finance", "terse"])
def test_planted_near_copies_in_shipped_domains_are_found(name: str) -> None:
    domain, pairs = planted(load_domain(DomainSpec(name=name)))
    # a swap of two equal tokens (two "|" of a table) only moves whitespace: then it is an exact copy
    found = [f for f in check_duplicates(domain, OPTS) if f.check in ("data.near_duplicates", "data.exact_duplicates")]
    for src, copy in pairs:
        assert any(src in f.item_ids and copy in f.item_ids for f in found), (src, copy)
    assert all(f.severity == "warning" for f in found)


def test_exact_copies_are_a_warning_when_few_and_an_error_when_many() -> None:
    base = load_domain(DomainSpec(name="json"))
    one = dataclasses.replace(base, train=[*base.train, dataclasses.replace(base.train[3], id="copy")])
    found = [f for f in check_duplicates(one, OPTS) if f.check == "data.exact_duplicates"]
    assert [(f.severity, set(f.item_ids)) for f in found] == [("warning", {base.train[3].id, "copy"})]
    # a whitespace / case change is still an exact copy
    many = [with_text(s, f"c{i}", "  " + s.prompt_text.upper()) for i, s in enumerate(base.train[:20])]
    lots = dataclasses.replace(base, train=[*base.train, *many])
    found = [f for f in check_duplicates(lots, OPTS) if f.check == "data.exact_duplicates"]
    assert len(found) == 20 and all(f.severity == "error" for f in found)


def test_same_prompt_with_different_references_is_a_conflict_not_a_copy() -> None:
    base = load_domain(DomainSpec(name="math"))
    twin = dataclasses.replace(base.train[0], id="twin", reference={"answer": -1})
    d = dataclasses.replace(base, train=[*base.train, twin])
    found = check_duplicates(d, OPTS)
    assert [f.item_ids for f in found if f.check == "data.conflicting_references"] == [(base.train[0].id, "twin")]
    assert not [f for f in found if f.check == "data.exact_duplicates"]


def test_free_text_domain_clean_and_planted() -> None:
    rng = random.Random(3)
    vocab = ["".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(3, 9))) for _ in range(3000)]
    train = [sample(f"t{i}", " ".join(rng.choices(vocab, k=rng.randint(10, 30)))) for i in range(300)]
    eval_ = [sample(f"e{i}", " ".join(rng.choices(vocab, k=20))) for i in range(30)]
    d = Domain("free", train, eval_, Zero())
    assert check_duplicates(d, OPTS) == []
    d2, pairs = planted(d)
    near = [f for f in check_duplicates(d2, OPTS) if f.check == "data.near_duplicates"]
    assert len(near) == 4 and {frozenset(f.item_ids) for f in near} == {frozenset(p) for p in pairs}


def test_template_variants_are_not_copies() -> None:
    names, things = ["Tom", "Anna", "Omar", "Li"], ["cards", "pens", "coins"]
    samples = [sample(f"s{i}", f"{n} has {a} {t} and gives away 1. How many {t} are left?", {"answer": a - 1})
               for i, (n, t, a) in enumerate((n, t, a) for n in names for t in things for a in (3, 4))]
    idx = TextIndex.build(samples)
    by = {s.prompt_text: s.id for s in samples}
    tom, omar = by["Tom has 4 cards and gives away 1. How many cards are left?"], by[
        "Omar has 4 cards and gives away 1. How many cards are left?"]
    assert idx.is_template_variant(tom, omar)  # a slot of the template: both names fill it often
    edit = sample("edit", "Tom has 4 cards and hands away 1. How many cards are left?", {"answer": 3})
    idx = TextIndex.build([*samples, edit])
    assert not idx.is_template_variant(tom, "edit")  # "hands" fills that place nowhere else: an edit
    assert idx.same_task(tom, "edit", 0.8) is not None


def test_normalize_keeps_digits_and_punctuation() -> None:
    assert normalize("  What is\n6 + 8? ") == normalize("what IS 6 + 8?") != normalize("what is 6 + 9?")


def test_malformed_messages_do_not_crash() -> None:
    bad = Sample("bad", "t", ({"role": "user", "content": None},), {})  # type: ignore[dict-item]
    d = Domain("t", [sample("a", "one two three"), bad], [sample("e", "four five six")], Zero())
    check_duplicates(d, OPTS)

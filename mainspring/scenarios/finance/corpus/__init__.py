"""The synthetic filings corpus: four fictional companies' 10-Ks, 10-Qs, earnings releases and one 10-K/A,
their facts.json (SEC company-facts shape) and ~300 evaluation questions, generated offline from a seed.
The on-disk contract is corpus_format.py."""

from mainspring.scenarios.finance.corpus.generate import generate_corpus, load_facts, load_manifest, load_questions

__all__ = ["generate_corpus", "load_facts", "load_manifest", "load_questions"]

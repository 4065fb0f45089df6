"""Exact and near duplicates within a split: MinHash + LSH over word sets, confirmed pair by pair.

How thresholds relate to templated prompts (the shipped domains are generated from templates):

- The similarity is the Jaccard index of the prompts' word *sets* (casefolded `\\w+` tokens: punctuation
  dropped, digits kept). One changed word in an n-word prompt gives about (n-1)/(n+1): 0.82 at 10 words,
  0.9 at 20. Word 5-gram shingles would give (n-9)/(n+1), below 0.8 for any prompt under ~50 words, so
  they cannot see a one-word edit in the short prompts RL domains use.
- Word sets alone call every pair of items drawn from one template near duplicates ("Tom has 4 cards"
  vs "Omar has 4 cards", "... came out in 1973" vs "... in 1994"). Two rules, both general, separate
  those template *variants* from copies (see `is_template_variant`):
  1. every difference is a substitution of numbers by numbers (the task's parameters changed), or of a
     span by another span that both fill the same context (the words around them) in at least two
     items each: a slot the generator fills. An edit brings in a word no other item has there, or
     deletes / inserts words, so it never passes;
  2. a pair whose references differ is two tasks (a copy keeps its reference): not a duplicate.
- MinHash LSH proposes candidate pairs at a band threshold below the confirming one (for recall);
  each candidate is confirmed with the exact Jaccard index, so estimates never decide a finding.

Exact duplicates (casefold, whitespace collapsed, punctuation and digits kept) are a warning while they
are a few copies, an error once the extra copies (two or more) exceed `EXACT_ERROR_FRACTION` of the split: then the
split's weighting is really skewed, and usually a join or export went wrong.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import json
import re
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from datasketch import MinHash, MinHashLSH

from mainspring.train.domains.base import Domain, Sample
from mainspring.train.inspect.findings import Finding, InspectOptions, items

EXACT_ERROR_FRACTION = 0.03  # extra exact copies above this share of a split: the data set is wrong
NUM_PERM = 128
MAX_SPAN = 3  # longest substituted span the slot rule considers (template alternatives are short)
MAX_LISTED = 50  # clusters reported one per finding; the rest go into one summary finding
_WORD = re.compile(r"\w+")
_SPACE = re.compile(r"\s+")


def normalize(text: str) -> str:
    """The exact-duplicate key: casefolded, whitespace collapsed; digits and punctuation kept."""
    return _SPACE.sub(" ", text.casefold()).strip()


def tokens(text: str) -> list[str]:
    return _WORD.findall(text.casefold())


def jaccard(a: set[str], b: set[str]) -> float:
    return len(a & b) / len(a | b) if a or b else 1.0


def prompt_text(sample: Sample) -> str:
    """`Sample.prompt_text`, tolerant of malformed messages (check_malformed reports those)."""
    try:
        return sample.prompt_text
    except (KeyError, TypeError, AttributeError):
        msgs = sample.messages if isinstance(sample.messages, (list, tuple)) else ()
        return "\n".join(m["content"] for m in msgs if isinstance(m, dict) and m.get("role") == "user"
                         and isinstance(m.get("content"), str))


def reference_key(sample: Sample) -> str:
    """The reference as canonical JSON: two samples with the same key ask for the same answer."""
    try:
        return json.dumps(sample.reference, sort_keys=True, default=repr)
    except (TypeError, ValueError):  # unsortable mixed keys: fall back to repr, still deterministic
        return repr(sample.reference)


def _norm(tok: str) -> str:
    # numbers are parameters: contexts and fillers match whatever the number is
    return "<n>" if tok.isdigit() else tok  # "2019", "3" (of "3.5"); not "w2" or "covid19"


@dataclass
class TextIndex:
    """Word sets of a domain's prompts plus the slot statistics `is_template_variant` reads, built over
    both splits (a template's slots show in either)."""

    words: dict[str, list[str]]  # sample id -> tokens
    sets: dict[str, set[str]]
    refs: dict[str, str]
    fillers: Counter[tuple[str, tuple[str, ...], str]]  # (left, span, right) -> items having it

    @classmethod
    def build(cls, samples: Iterable[Sample]) -> TextIndex:
        words: dict[str, list[str]] = {}
        refs: dict[str, str] = {}
        fillers: Counter[tuple[str, tuple[str, ...], str]] = Counter()
        for s in samples:
            t = tokens(prompt_text(s))
            words[s.id], refs[s.id] = t, reference_key(s)
            n = ["^", *(_norm(x) for x in t), "$"]
            seen = {(n[i - 1], tuple(n[i:i + k]), n[i + k])
                    for k in range(1, MAX_SPAN + 1) for i in range(1, len(n) - k)}
            fillers.update(seen)
        return cls(words, {k: set(v) for k, v in words.items()}, refs, fillers)

    def similarity(self, a: str, b: str) -> float:
        return jaccard(self.sets[a], self.sets[b])

    def is_template_variant(self, a: str, b: str) -> bool:
        """True when a and b differ only in a template's slots or numbers (two tasks from one template)."""
        x, y = self.words[a], self.words[b]
        if x == y:
            return False
        # numbers are the task's parameters: a pair that differs only in its numbers is two tasks
        x, y = [_norm(t) for t in x], [_norm(t) for t in y]
        if x == y:
            return True
        ops = [op for op in difflib.SequenceMatcher(None, x, y, autojunk=False).get_opcodes() if op[0] != "equal"]
        for tag, i1, i2, j1, j2 in ops:
            if tag != "replace":  # a deleted or inserted word is an edit, never a slot
                return False
            old, new = x[i1:i2], y[j1:j2]
            if len(old) > MAX_SPAN or len(new) > MAX_SPAN:
                return False
            left = x[i1 - 1] if i1 > 0 else "^"
            right = x[i2] if i2 < len(x) else "$"
            if self.fillers[(left, tuple(old), right)] < 2 or self.fillers[(left, tuple(new), right)] < 2:
                return False
        return True

    @functools.cached_property
    def document_frequency(self) -> Counter[str]:
        """word -> how many prompts use it."""
        return Counter(w for ws in self.sets.values() for w in ws)

    def only_substitutions(self, a: str, b: str) -> bool:
        """True when b is a with words swapped one for one for words other prompts also use, none
        inserted or deleted: the shape of a template sibling, which a small sample may not have enough
        items to recognise as one. A word no other prompt has (a planted edit) does not count."""
        x, y = self.words[a], self.words[b]
        if x == y:
            return False
        used = self.document_frequency
        for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, x, y, autojunk=False).get_opcodes():
            if tag == "equal":
                continue
            if tag != "replace" or i2 - i1 != j2 - j1 or any(used[w] < 2 for w in (*x[i1:i2], *y[j1:j2])):
                return False
        return True

    def same_task(self, a: str, b: str, threshold: float) -> float | None:
        """The pair's similarity when it is a copy (similar, same reference, not a template variant)."""
        sim = self.similarity(a, b)
        if sim < threshold or self.refs[a] != self.refs[b] or self.is_template_variant(a, b):
            return None
        return sim


def minhash(words: set[str], seed: int = 1) -> MinHash:
    m = MinHash(num_perm=NUM_PERM, seed=seed)
    m.update_batch([w.encode() for w in words] or [b""])
    return m


def lsh_threshold(confirm: float) -> float:
    """Band threshold for candidates: below the confirming one, so MinHash's estimation error
    (about 1/sqrt(NUM_PERM) = 0.09) costs little recall."""
    return max(0.2, min(0.95, confirm - 0.15))


def similar_pairs(ids: Sequence[str], index: TextIndex, threshold: float) -> list[tuple[str, str, float]]:
    """Confirmed copies among `ids` (a, b, similarity), a before b in `ids` order."""
    lsh = MinHashLSH(threshold=lsh_threshold(threshold), num_perm=NUM_PERM)
    pos = {sid: i for i, sid in enumerate(ids)}
    out: list[tuple[str, str, float]] = []
    for sid in ids:
        m = minhash(index.sets[sid])
        for other in lsh.query(m):
            sim = index.same_task(other, sid, threshold)
            if sim is not None:
                out.append((other, sid, sim) if pos[other] < pos[sid] else (sid, other, sim))
        lsh.insert(sid, m)
    return out


def clusters(pairs: Iterable[tuple[str, str]], order: Sequence[str]) -> list[list[str]]:
    """Connected components of the pairs (union-find), members and clusters in `order`."""
    parent: dict[str, str] = {}

    def root(x: str) -> str:
        while parent.get(x, x) != x:
            parent[x] = parent.get(parent[x], parent[x])
            x = parent[x]
        return x

    for a, b in pairs:
        parent.setdefault(a, a)
        parent.setdefault(b, b)
        ra, rb = root(a), root(b)
        if ra != rb:
            parent[rb] = ra
    groups: dict[str, list[str]] = defaultdict(list)
    for sid in order:
        if sid in parent:
            groups[root(sid)].append(sid)
    return [g for g in groups.values() if len(g) > 1]


def _snippet(text: str, n: int = 120) -> str:
    text = _SPACE.sub(" ", text).strip()
    return text if len(text) <= n else text[:n - 1] + "…"


def _cluster_findings(check: str, severity: Any, domain: str, split: str, groups: list[list[str]],
                      text: dict[str, str], what: str, fix: str, extra: dict[str, dict[str, Any]]) -> list[Finding]:
    out = []
    for g in groups[:MAX_LISTED]:
        key = "|".join(g)
        out.append(Finding(check, severity, domain, f"{len(g)} {what} in {split}: {_snippet(text[g[0]], 60)!r}",
                           tuple(g), {"split": split, "size": len(g), "text": _snippet(text[g[0]]),
                                      **extra.get(key, {})}, fix))
    rest = groups[MAX_LISTED:]
    if rest:
        ids = tuple(i for g in rest for i in g)
        out.append(Finding(check, severity, domain, f"{len(rest)} more clusters of {what} in {split}", ids,
                           {"split": split, "clusters": [g for g in rest]}, fix))
    return out


def check_duplicates(domain: Domain, options: InspectOptions) -> list[Finding]:
    """Exact duplicates ("data.exact_duplicates") and near duplicates ("data.near_duplicates") within
    each split; one finding per cluster, its item ids the cluster's members."""
    out: list[Finding] = []
    train, eval_ = items(domain, options, "train"), items(domain, options, "eval")
    index = TextIndex.build([*train, *eval_])
    for split, samples in (("train", train), ("eval", eval_)):
        if not samples:
            continue
        text = {s.id: prompt_text(s) for s in samples}
        by_text: dict[str, list[str]] = defaultdict(list)
        for s in samples:
            by_text[hashlib.sha1(normalize(prompt_text(s)).encode()).hexdigest()].append(s.id)
        exact: list[list[str]] = []
        conflicts: list[list[str]] = []
        for g in by_text.values():
            if len(g) > 1:
                # the same words asking for different answers is a contradiction, not a copy
                (exact if len({index.refs[i] for i in g}) == 1 else conflicts).append(g)
        extra_copies = sum(len(g) - 1 for g in exact)
        share = extra_copies / len(samples)
        # one stray copy is a warning even in a tiny split: an error needs a pattern, not an accident
        severity = "error" if share > EXACT_ERROR_FRACTION and extra_copies > 1 else "warning"
        out += _cluster_findings("data.exact_duplicates", severity, domain.name, split, exact, text,
                                 "exact copies", "keep one copy of each prompt (the extra copies weigh it "
                                 "double in training)", {"|".join(g): {"extra_share": round(share, 4)} for g in exact})
        out += _cluster_findings("data.conflicting_references", "warning", domain.name, split, conflicts, text,
                                 "copies of one prompt with different references",
                                 "keep the right reference; at most one of them can be scored correctly", {})
        dup = {i for g in exact + conflicts for i in g[1:]}
        ids = [s.id for s in samples if s.id not in dup]  # near duplicates among distinct prompts only
        pairs = similar_pairs(ids, index, options.near_duplicate_jaccard)
        groups = clusters([(a, b) for a, b, _ in pairs], ids)
        sims: dict[str, list[float]] = defaultdict(list)
        member = {sid: "|".join(g) for g in groups for sid in g}
        for a, _, sim in pairs:
            sims[member[a]].append(sim)
        extra = {k: {"min_jaccard": round(min(v), 3), "max_jaccard": round(max(v), 3)} for k, v in sims.items()}
        out += _cluster_findings("data.near_duplicates", "warning", domain.name, split, groups, text,
                                 "near copies (same reference, a few words changed)",
                                 "drop all but one of each cluster, or make them really different tasks", extra)
    return out

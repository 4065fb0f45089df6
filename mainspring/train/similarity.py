"""The text_similarity grader's metrics, each a score in [0, 1] of (output, reference).

Written here rather than imported: each is a few lines, and the usual packages (nltk, rouge-score,
sacrebleu, rapidfuzz) would add dependencies for what is a loop over n-grams.

- fuzzy_match: difflib's SequenceMatcher ratio (2·matches / total characters).
- bleu: sentence BLEU (Papineni et al. 2002), n-grams up to 4 (fewer for texts shorter than that),
  brevity penalty, add-one smoothing for n > 1 (Lin & Och 2004) so one missing 4-gram is not a zero.
- gleu: Google-BLEU (Wu et al. 2016): min(precision, recall) over all 1..4-grams.
- rouge_1 … rouge_5: F1 of n-gram overlap; rouge_l: F1 of the longest common subsequence. Lowercased
  alphanumeric tokens, as the rouge-score package tokenizes.
- cosine: cosine similarity of all-MiniLM-L6-v2 embeddings (mainspring.embeddings), clipped at 0.
- meteor is not offered: it needs WordNet synonyms and a stemmer.
"""

from __future__ import annotations

import difflib
import math
import re
from collections import Counter
from functools import partial
from typing import Callable, Sequence

MAX_LCS_TOKENS = 1000  # rouge_l is O(n·m); longer texts are cut (a reward, not a benchmark)
MAX_FUZZY_CHARS = 20_000  # SequenceMatcher is quadratic in the worst case, likewise
_BLEU_TOKEN = re.compile(r"\w+|[^\w\s]")
_ROUGE_TOKEN = re.compile(r"[a-z0-9]+")


def ngrams(tokens: Sequence[str], n: int) -> Counter:
    return Counter(tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1))


def fuzzy_match(output: str, reference: str) -> float:
    if not output and not reference:
        return 1.0
    a, b = output[:MAX_FUZZY_CHARS], reference[:MAX_FUZZY_CHARS]
    return difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()


def bleu(output: str, reference: str, max_n: int = 4) -> float:
    hyp, ref = _BLEU_TOKEN.findall(output), _BLEU_TOKEN.findall(reference)
    if not hyp or not ref:
        return float(hyp == ref)
    order = min(max_n, len(hyp), len(ref))
    log_p = 0.0
    for n in range(1, order + 1):
        h, r = ngrams(hyp, n), ngrams(ref, n)
        matches, total = sum((h & r).values()), sum(h.values())
        if n > 1:
            matches, total = matches + 1, total + 1
        if matches == 0:
            return 0.0
        log_p += math.log(matches / total) / order
    brevity = 1.0 if len(hyp) >= len(ref) else math.exp(1 - len(ref) / len(hyp))
    return brevity * math.exp(log_p)


def gleu(output: str, reference: str, max_n: int = 4) -> float:
    hyp, ref = _BLEU_TOKEN.findall(output), _BLEU_TOKEN.findall(reference)
    h: Counter[tuple[str, ...]] = Counter()
    r: Counter[tuple[str, ...]] = Counter()
    for n in range(1, max_n + 1):
        h.update(ngrams(hyp, n))
        r.update(ngrams(ref, n))
    if not h or not r:
        return float(not h and not r)
    matches = sum((h & r).values())
    return min(matches / sum(h.values()), matches / sum(r.values()))


def _f1(matches: int, n_out: int, n_ref: int) -> float:
    if matches == 0 or n_out == 0 or n_ref == 0:
        return 0.0
    p, r = matches / n_out, matches / n_ref
    return 2 * p * r / (p + r)


def rouge_n(output: str, reference: str, n: int) -> float:
    h, r = ngrams(_ROUGE_TOKEN.findall(output.lower()), n), ngrams(_ROUGE_TOKEN.findall(reference.lower()), n)
    return _f1(sum((h & r).values()), sum(h.values()), sum(r.values()))


def rouge_l(output: str, reference: str) -> float:
    a = _ROUGE_TOKEN.findall(output.lower())[:MAX_LCS_TOKENS]
    b = _ROUGE_TOKEN.findall(reference.lower())[:MAX_LCS_TOKENS]
    prev = [0] * (len(b) + 1)
    for x in a:  # one row of the LCS table at a time
        cur = [0]
        for j, y in enumerate(b):
            cur.append(prev[j] + 1 if x == y else max(prev[j + 1], cur[j]))
        prev = cur
    return _f1(prev[-1], len(a), len(b))


def cosine(output: str, reference: str) -> float:
    from mainspring.embeddings import shared_model  # loaded once per process, on first use

    v = shared_model().embed([output, reference]).numpy()
    return max(0.0, min(1.0, float(v[0] @ v[1])))


METRICS: dict[str, Callable[[str, str], float]] = {
    "fuzzy_match": fuzzy_match, "bleu": bleu, "gleu": gleu, "cosine": cosine, "rouge_l": rouge_l,
    **{f"rouge_{n}": partial(rouge_n, n=n) for n in range(1, 6)},
}
UNSUPPORTED = {"meteor": "it needs WordNet synonyms and a stemmer"}

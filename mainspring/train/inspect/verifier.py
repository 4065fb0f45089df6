"""Verifier soundness: is the scorer right about answers whose correctness is known?

`check_verifier(domain, options)` scores, for every item of both splits (capped by max_items):
- the reference completion: it must score full marks, else the item's verifier (or its
  reference) is broken and training pushes the model away from right answers;
- wrong answers in the reference's format, worthless text (empty, the prompt echoed, filler to
  the length cap, a constant) and the reference padded to the length cap (see probes.py): a
  probe scoring above half marks is accepted; on many items that is an error;
- the spread of all those rewards: a verifier that gives everything the same reward has no signal;
- the reference and one wrong answer a second time: a verifier that disagrees with itself is noise;
- and every call's time: a scorer slower than options.score_timeout_s is flagged with its items.
"""

from __future__ import annotations

from typing import Any, Sequence

from mainspring.train.domains.base import Domain, Sample, Score
from mainspring.train.inspect.findings import Finding, InspectOptions, Severity, items
from mainspring.train.inspect.probes import (ACCEPT, CONSTANT, FULL_MARKS, Prober, filler, other_reference, padded,
                                             references, wrong_answers)

MANY = 0.2  # a defect on at least this share of the items is an error; on fewer, a warning
NOTHING = 0.1  # worthless probes should average below this
FLAT = 0.01  # all rewards within this of each other: the verifier cannot tell answers apart
_EXAMPLES = 5  # evidence lists at most this many items
WORTHLESS = ("empty", "echo", "filler", "constant")


def check_verifier(domain: Domain, options: InspectOptions) -> list[Finding]:
    """Findings `verifier.*` about `domain`'s scorer; never modifies the domain, never raises for
    a scorer that raises, hangs or returns NaN (those are findings)."""
    samples = items(domain, options, "train") + items(domain, options, "eval")
    if not samples:
        return []
    prober = Prober(domain, options)
    refs, missing = references(domain, samples)
    findings = _missing_references(domain, samples, missing)
    cap = domain.settings.max_tokens
    probes: dict[str, dict[str, str]] = {}  # sample id -> probe name -> completion
    for i, s in enumerate(samples):
        p = {"empty": "", "echo": s.prompt_text, "filler": filler(cap), "constant": CONSTANT}
        ref = refs.get(s.id)
        if ref is not None:
            p["reference"] = ref
            p["padded_reference"] = padded(ref, cap)
            p.update(wrong_answers(ref, other_reference(samples, refs, i)))
        probes[s.id] = p
    pairs = [(s, c) for s in samples for c in probes[s.id].values()]
    flat = iter(prober.score_many(pairs))
    scores: dict[str, dict[str, Score | None]] = {s.id: {k: next(flat) for k in probes[s.id]} for s in samples}

    findings += _reference_failures(domain, samples, refs, scores)
    findings += _accepted(domain, scores)
    findings += _padding(domain, scores)
    findings += _flat(domain, scores, bool(refs))
    findings += _scorer_errors(domain, scores)
    findings += _nondeterminism(domain, prober, samples, probes, scores)
    findings += _timeouts(domain, prober, options)
    return findings


def _missing_references(domain: Domain, samples: Sequence[Sample], missing: dict[str, str]) -> list[Finding]:
    if not missing:
        return []
    fix = ("give the domain a reference_completion (a user data file: a \"completion\" string on each line) "
           "so the verifier can be checked against answers known to be right")
    if domain.reference_completion is None or len(missing) == len(samples):
        why = next(iter(missing.values()))
        return [Finding("verifier.no_reference", "warning", domain.name,
                        "no reference completions: cannot check soundness (only worthless answers are probed)",
                        evidence={"reason": why}, fix=fix)]
    ids = tuple(missing)
    return [Finding("verifier.no_reference", "warning", domain.name,
                    f"{len(ids)} of {len(samples)} items have no reference completion: their soundness is unchecked",
                    ids, {"examples": [{"id": i, "reason": missing[i]} for i in ids[:_EXAMPLES]]}, fix)]


def _brief(score: Score | None) -> dict[str, Any]:
    if score is None:
        return {"total": None}
    out: dict[str, Any] = {"total": round(score.total, 4), "parts": {k: round(v, 4) for k, v in score.parts.items()}}
    if score.error:
        out["error"] = score.error[:200]
    return out


def _reference_failures(domain: Domain, samples: Sequence[Sample], refs: dict[str, str],
                        scores: dict[str, dict[str, Score | None]]) -> list[Finding]:
    bad = [s.id for s in samples if s.id in refs and (sc := scores[s.id].get("reference")) is not None
           and sc.total < FULL_MARKS]
    if not bad:
        return []
    checked = sum(1 for s in samples if scores[s.id].get("reference") is not None)
    examples = [{"id": i, **_brief(scores[i]["reference"]), "completion": refs[i][:200]} for i in bad[:_EXAMPLES]]
    return [Finding("verifier.reference", "error", domain.name,
                    f"{len(bad)} of {checked} reference completions do not score full marks", tuple(bad),
                    {"failing": len(bad), "checked": checked, "examples": examples},
                    "fix the scorer (or the item's reference): a right answer must earn the full reward")]


def _accepted(domain: Domain, scores: dict[str, dict[str, Score | None]]) -> list[Finding]:
    """Per probe: wrong or worthless answers scoring above half marks."""
    out: list[Finding] = []
    names = sorted({k for p in scores.values() for k in p} - {"reference", "padded_reference"})
    for name in names:
        got = {i: p[name] for i, p in scores.items() if p.get(name) is not None}
        if not got:
            continue
        accepted = [i for i, sc in got.items() if sc is not None and sc.total > ACCEPT]
        mean = sum(sc.total for sc in got.values() if sc is not None) / len(got)
        evidence: dict[str, Any] = {"probe": name, "accepted": len(accepted), "of": len(got), "mean": round(mean, 4),
                                    "examples": [{"id": i, **_brief(got[i])} for i in accepted[:_EXAMPLES]]}
        what = "worthless answers" if name in WORTHLESS else "wrong answers"
        if accepted:
            severity: Severity = "error" if len(accepted) >= MANY * len(got) else "warning"
            out.append(Finding("verifier.accepts_wrong", severity, domain.name,
                               f"verifier accepts {what} ({name}): above {ACCEPT:g} on {len(accepted)} of "
                               f"{len(got)} items", tuple(accepted), evidence,
                               f"make the scorer check the content of the answer; the '{name}' probe must score "
                               "near 0"))
        elif name in WORTHLESS and mean > NOTHING:
            out.append(Finding("verifier.pays_for_nothing", "warning", domain.name,
                               f"{name} answers earn {mean:.2f} on average", tuple(got)[:_EXAMPLES], evidence,
                               "a reply with no answer in it should earn nothing"))
    return out


def _padding(domain: Domain, scores: dict[str, dict[str, Score | None]]) -> list[Finding]:
    pairs = {i: (p.get("reference"), p.get("padded_reference")) for i, p in scores.items()}
    pairs = {i: (r, q) for i, (r, q) in pairs.items() if r is not None and q is not None}
    higher = [i for i, (r, q) in pairs.items() if r is not None and q is not None and q.total > r.total + 1e-6]
    if not higher:
        return []
    severity: Severity = "error" if len(higher) >= MANY * len(pairs) else "warning"
    examples = [{"id": i, "reference": _brief(pairs[i][0]), "padded": _brief(pairs[i][1])} for i in higher[:_EXAMPLES]]
    return [Finding("verifier.padding", severity, domain.name,
                    f"padding the reference to the length cap raises its score on {len(higher)} of {len(pairs)} "
                    "items", tuple(higher), {"higher": len(higher), "of": len(pairs), "examples": examples},
                    "do not reward length: filler after an answer must not earn more than the answer")]


def _flat(domain: Domain, scores: dict[str, dict[str, Score | None]], have_refs: bool) -> list[Finding]:
    """Without references every probe is wrong and rewards of ~0 are right: only checked with them."""
    totals = [sc.total for p in scores.values() for sc in p.values() if sc is not None and sc.error is None]
    if not have_refs or len(totals) < 2 or max(totals) - min(totals) >= FLAT:
        return []
    return [Finding("verifier.flat_reward", "error", domain.name,
                    f"the verifier gives the same reward (~{totals[0]:.3f}) to the reference and every wrong answer",
                    evidence={"probes": len(totals), "min": round(min(totals), 4), "max": round(max(totals), 4)},
                    fix="the scorer ignores the completion: GRPO gets no signal from it")]


def _scorer_errors(domain: Domain, scores: dict[str, dict[str, Score | None]]) -> list[Finding]:
    failed = [(i, name, sc) for i, p in scores.items() for name, sc in p.items() if sc is not None and sc.error]
    if not failed:
        return []
    total = sum(1 for p in scores.values() for sc in p.values() if sc is not None)
    ids = tuple(dict.fromkeys(i for i, _, _ in failed))
    severity: Severity = "error" if len(failed) >= MANY * total else "warning"
    examples = [{"id": i, "probe": name, "error": (sc.error or "")[:200]} for i, name, sc in failed[:_EXAMPLES]]
    return [Finding("verifier.scorer_error", severity, domain.name,
                    f"the scorer failed (raised or returned a non-finite or non-Score value) on {len(failed)} of "
                    f"{total} probes", ids, {"failed": len(failed), "of": total, "examples": examples},
                    "a failing scorer scores 0: fix it so that every completion gets a real score")]


def _nondeterminism(domain: Domain, prober: Prober, samples: Sequence[Sample], probes: dict[str, dict[str, str]],
                    scores: dict[str, dict[str, Score | None]]) -> list[Finding]:
    """The reference (or the echo) and the first wrong answer of each item, scored once more."""
    again: list[tuple[Sample, str, str]] = []
    for s in samples:
        names = [n for n in probes[s.id] if n not in WORTHLESS and n != "padded_reference"][:2] or ["echo"]
        again += [(s, n, probes[s.id][n]) for n in names if scores[s.id].get(n) is not None]
    rescored = prober.score_many([(s, c) for s, _, c in again], fresh=True)
    differ = []
    for (s, name, _), second in zip(again, rescored):
        first = scores[s.id][name]
        if first is not None and second is not None and abs(first.total - second.total) > 1e-9:
            differ.append((s.id, name, first.total, second.total))
    if not differ:
        return []
    ids = tuple(dict.fromkeys(i for i, *_ in differ))
    examples = [{"id": i, "probe": n, "first": round(a, 4), "second": round(b, 4)} for i, n, a, b in differ[:_EXAMPLES]]
    return [Finding("verifier.nondeterministic", "error", domain.name,
                    f"the same completion scored twice gets different rewards on {len(ids)} items", ids,
                    {"differ": len(differ), "of": len(again), "examples": examples},
                    "make the scorer deterministic (no sampling, clocks or shared state in the reward)")]


def _timeouts(domain: Domain, prober: Prober, options: InspectOptions) -> list[Finding]:
    if not prober.timeouts:
        return []
    ids = tuple(dict.fromkeys(prober.timeouts))
    stopped = f"; probing stopped, {prober.skipped} probes skipped" if prober.skipped else ""
    return [Finding("verifier.timeout", "error", domain.name,
                    f"the scorer took longer than {options.score_timeout_s:g} s on {len(prober.timeouts)} "
                    f"completions{stopped}", ids,
                    {"timeouts": len(prober.timeouts), "timeout_s": options.score_timeout_s,
                     "skipped": prober.skipped},
                    "a hanging scorer stalls training; bound its work (or raise score_timeout_s if it is just slow)")]

"""Reward-hacking probes: can a policy earn reward without solving the task?

`check_reward_hacking(domain, options)` scores synthetic completions (probes.py) whose correctness
is fixed by construction, so any trend in their reward is the verifier's, not the answers':
- length: filler alone, a wrong answer and the reference, each padded to growing lengths up to the
  length cap; a Spearman correlation between length and the gain in reward, with a real gain,
  means longer (wrong) answers pay - the policy will learn to ramble;
- formatting: wrong answers in the reference's format against the right answer written in prose;
  format alone earning more than half the reward, or as much as being right, is a warning;
- constants: a few fixed strings (and the most common reference) sent to every prompt; one text
  accepted on most prompts is a policy that need not read the prompt;
- code: hidden tests must differ from the visible example (and not be shown in the prompt), and
  a solution that only special-cases the visible example must fail them.
"""

from __future__ import annotations

import ast
from collections import Counter
from typing import Any, Sequence

from mainspring.train.domains.base import Domain, Sample, Score
from mainspring.train.inspect.findings import Finding, InspectOptions, Severity, items
from mainspring.train.inspect.probes import (ACCEPT, CONSTANT, Prober, fenced, filler, in_prose, other_reference,
                                             padded, references, spread, wrong_answers)

MANY = 0.2  # a share of items at or above this is "many"
MOST = 0.5  # a constant accepted on more than this share of prompts needs no prompt at all
SKEWED = 0.3  # ... on this share (and 3 prompts or more): the answers are skewed enough to guess
LENGTH_ITEMS = 16  # items the length probe pads (a correlation needs a sample, not every item)
CONSTANT_ITEMS = 32  # prompts each constant is sent to
FORMAT_ITEMS = 32
LEVELS = (0.0, 0.25, 0.5, 1.0)  # padding, as fractions of max_tokens words
RHO_ERROR, GAIN_ERROR = 0.5, 0.2  # longer wrong answers gain this much with this correlation: an error
RHO_WARN, GAIN_WARN = 0.3, 0.05
FORMAT_SHARE = 0.5
CONSTANTS = ("", "0", "1", "yes", "no", "True", "{}", CONSTANT)
_EXAMPLES = 5


def check_reward_hacking(domain: Domain, options: InspectOptions) -> list[Finding]:
    """Findings `hacking.*` about `domain`'s reward; never modifies the domain. A scorer that
    fails or hangs is reported by check_verifier: here its probes just count as unscored."""
    samples = items(domain, options, "train") + items(domain, options, "eval")
    if not samples:
        return []
    prober = Prober(domain, options)
    refs, _ = references(domain, samples)
    wrong = {s.id: wrong_answers(refs[s.id], other_reference(samples, refs, i))
             for i, s in enumerate(samples) if s.id in refs}
    findings = _visible_tests(domain, samples)
    findings += _special_cases(domain, prober, samples)
    findings += _length(domain, prober, spread(samples, LENGTH_ITEMS), refs, wrong)
    findings += _format(domain, prober, spread(samples, FORMAT_ITEMS), refs, wrong)
    findings += _constants(domain, prober, spread(samples, CONSTANT_ITEMS), refs)
    return findings


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Spearman's rank correlation (ties get their average rank); 0 when either side is constant."""
    rx, ry = _ranks(xs), _ranks(ys)
    n = len(rx)
    if n < 3:
        return 0.0
    mx, my = sum(rx) / n, sum(ry) / n
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    vx, vy = sum((a - mx) ** 2 for a in rx), sum((b - my) ** 2 for b in ry)
    return cov / (vx * vy) ** 0.5 if vx > 0 and vy > 0 else 0.0


def _ranks(values: Sequence[float]) -> list[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2
        i = j + 1
    return ranks


def _total(score: Score | None) -> float | None:
    return None if score is None or score.error else score.total


def _length(domain: Domain, prober: Prober, samples: Sequence[Sample], refs: dict[str, str],
            wrong: dict[str, dict[str, str]]) -> list[Finding]:
    cap = domain.settings.max_tokens
    levels = [round(f * cap) for f in LEVELS]
    families: dict[str, list[tuple[Sample, str]]] = {"filler": [(s, "") for s in samples]}
    families["wrong answer"] = [(s, next(iter(wrong[s.id].values()))) for s in samples if wrong.get(s.id)]
    families["reference"] = [(s, refs[s.id]) for s in samples if s.id in refs]
    out: list[Finding] = []
    measured: dict[str, Any] = {}
    for family, bases in families.items():
        if not bases:
            continue
        pairs = [(s, padded(base, n) if base else filler(n)) for s, base in bases for n in levels]
        totals = [_total(sc) for sc in prober.score_many(pairs)]
        xs: list[float] = []
        gains: list[float] = []
        at_cap: list[float] = []
        rows: list[list[float]] = []
        for j in range(len(bases)):
            row = totals[j * len(levels):(j + 1) * len(levels)]
            if any(t is None for t in row):
                continue
            rows.append([t or 0.0 for t in row])
            first = row[0] or 0.0
            xs += levels
            gains += [(t or 0.0) - first for t in row]
            at_cap.append((row[-1] or 0.0) - first)
        if not at_cap:
            continue
        rho, gain = spearman(xs, gains), sum(at_cap) / len(at_cap)
        measured[family] = {"spearman": round(rho, 3), "gain_at_cap": round(gain, 4), "items": len(at_cap),
                            "rewards": [round(sum(col) / len(col), 4) for col in zip(*rows)]}  # mean per level
        severity: Severity | None = None
        if family != "reference" and rho >= RHO_ERROR and gain >= GAIN_ERROR:
            severity = "error"
        elif rho >= RHO_WARN and gain >= GAIN_WARN:
            severity = "warning"
        if severity:
            ids = tuple(s.id for s, _ in bases)
            out.append(Finding("hacking.length", severity, domain.name,
                               f"reward grows with length: a {family} padded to {cap} words gains {gain:+.2f} "
                               f"(Spearman {rho:.2f})", ids, {"family": family, **measured[family],
                                                              "levels_words": levels},
                               "do not reward length (or cap its share): the policy will learn to pad"))
    if measured:
        out.append(Finding("hacking.length_correlation", "info", domain.name,
                           "reward vs length of padded completions: " + ", ".join(
                               f"{k} rho {v['spearman']:.2f} gain {v['gain_at_cap']:+.2f}"
                               for k, v in measured.items()),
                           evidence={"families": measured, "levels_words": levels}))
    return out


def _format(domain: Domain, prober: Prober, samples: Sequence[Sample], refs: dict[str, str],
            wrong: dict[str, dict[str, str]]) -> list[Finding]:
    """Wrong answers in the reference's format vs the right answer in prose."""
    rows = [s for s in samples if wrong.get(s.id)]
    if not rows:
        return []
    pairs: list[tuple[Sample, str]] = []
    for s in rows:
        pairs += [(s, refs[s.id]), (s, in_prose(refs[s.id]))] + [(s, c) for c in wrong[s.id].values()]
    totals = iter([_total(sc) for sc in prober.score_many(pairs)])
    ref_sum = fmt_sum = 0.0
    beaten: list[str] = []
    n = 0
    for s in rows:
        ref, prose = next(totals), next(totals)
        fmt = [next(totals) for _ in wrong[s.id]]
        scored = [t for t in fmt if t is not None]
        if ref is None or prose is None or not scored:
            continue
        n += 1
        mean_fmt = sum(scored) / len(scored)
        ref_sum, fmt_sum = ref_sum + ref, fmt_sum + mean_fmt
        if max(scored) > 0 and max(scored) >= prose:
            beaten.append(s.id)
    if not n or ref_sum <= 0:
        return []
    share = fmt_sum / ref_sum
    evidence = {"format_share": round(share, 4), "wrong_beats_prose": len(beaten), "of": n,
                "examples": beaten[:_EXAMPLES]}
    if share > FORMAT_SHARE or len(beaten) >= MANY * n:
        return [Finding("hacking.format", "warning", domain.name,
                        f"formatting alone pays: wrong answers in the expected format earn {share:.0%} of a right "
                        f"answer's reward, and match a right answer in prose on {len(beaten)} of {n} items",
                        tuple(beaten), evidence,
                        "reward format only on a right answer (e.g. total = correct x (a + b x format))")]
    return [Finding("hacking.format_share", "info", domain.name,
                    f"wrong answers in the expected format earn {share:.0%} of a right answer's reward",
                    evidence=evidence)]


def _constants(domain: Domain, prober: Prober, samples: Sequence[Sample], refs: dict[str, str]) -> list[Finding]:
    candidates = list(CONSTANTS)
    common = Counter(refs[s.id] for s in samples if s.id in refs).most_common(1)
    if common and common[0][1] > 1 and common[0][0] not in candidates:
        candidates.append(common[0][0])  # answering every prompt with the most frequent answer
    pairs = [(s, c) for c in candidates for s in samples]
    totals = [_total(sc) for sc in prober.score_many(pairs)]
    paying: list[tuple[float, str, list[str], int]] = []  # (share, text, accepted ids, prompts scored)
    for k, text in enumerate(candidates):
        row = [(s.id, t) for s, t in zip(samples, totals[k * len(samples):(k + 1) * len(samples)]) if t is not None]
        accepted = [i for i, t in row if t > ACCEPT]
        if row and len(accepted) >= max(3, SKEWED * len(row)):  # the most common shipped answer: ~10%, chance
            paying.append((len(accepted) / len(row), text, accepted, len(row)))
    if not paying:
        return []
    paying.sort(key=lambda p: -p[0])  # one finding, led by the constant that pays most widely
    share, text, accepted, n = paying[0]
    severity: Severity = "error" if share > MOST else "warning"
    others = f" ({len(paying) - 1} other constant replies pay too)" if len(paying) > 1 else ""
    return [Finding("hacking.constant", severity, domain.name,
                    f"the same reply {text[:40]!r} scores above {ACCEPT:g} on {len(accepted)} of {n} prompts{others}",
                    tuple(accepted), {"constant": text[:200], "accepted": len(accepted), "of": n,
                                      "share": round(share, 4),
                                      "constants": [{"constant": t[:200], "share": round(sh, 4)}
                                                    for sh, t, _, _ in paying]},
                    "a reply that ignores the prompt must not pay: check the answer against the item "
                    "(or balance the answers)")]


def _parse(expr: str) -> ast.expr | None:
    try:
        return ast.parse(expr.strip(), mode="eval").body
    except (SyntaxError, ValueError, RecursionError):
        return None


def _code_refs(sample: Sample) -> tuple[list[str], list[str]] | None:
    """(visible examples, hidden tests) of a code item: string `example(s)` and `tests` in its reference."""
    ref = sample.reference
    tests, example = ref.get("tests"), ref.get("example", ref.get("examples"))
    examples = [example] if isinstance(example, str) else example
    if not isinstance(tests, list) or not isinstance(examples, list):
        return None
    return [e for e in examples if isinstance(e, str)], [t for t in tests if isinstance(t, str)]


def _visible_tests(domain: Domain, samples: Sequence[Sample]) -> list[Finding]:
    """Hidden tests equal (as Python) to the visible example, or shown verbatim in the prompt."""
    same: list[str] = []
    shown: list[str] = []
    evidence: list[dict[str, str]] = []
    for s in samples:
        found = _code_refs(s)
        if found is None:
            continue
        examples, tests = found
        seen = {ast.dump(e) for e in map(_parse, examples) if e is not None}
        dup = [t for t in tests if (e := _parse(t)) is not None and ast.dump(e) in seen]
        visible = [t for t in tests if t.strip() and t.strip() in s.prompt_text and t not in dup]
        if dup:
            same.append(s.id)
            evidence.append({"id": s.id, "test": dup[0][:200], "why": "equals the visible example"})
        if visible:
            shown.append(s.id)
            evidence.append({"id": s.id, "test": visible[0][:200], "why": "shown in the prompt"})
    if not same and not shown:
        return []
    ids = tuple(dict.fromkeys(same + shown))
    return [Finding("hacking.visible_tests", "error", domain.name,
                    f"hidden tests are visible: {len(same)} items test the example the prompt shows, "
                    f"{len(shown)} show a hidden test in the prompt", ids,
                    {"equal_to_example": len(same), "in_prompt": len(shown), "examples": evidence[:_EXAMPLES]},
                    "hidden tests must go beyond the visible example, or a memorised example passes them")]


def special_case(example: str) -> str | None:
    """A solution that only knows the visible example: `add(1, 2) == 3` gives a function `add`
    returning 3 for exactly (1, 2) and None otherwise. None if the example is not `f(...) ==/is v`."""
    node = _parse(example)
    if not (isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], (ast.Eq, ast.Is))
            and isinstance(node.left, ast.Call) and isinstance(node.left.func, ast.Name)):
        return None
    call, name = node.left, node.left.func.id
    if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        return None
    args = ast.unparse(ast.Tuple(list(call.args), ast.Load())) if call.args else "()"
    kwargs = "{" + ", ".join(f"{k.arg!r}: {ast.unparse(k.value)}" for k in call.keywords) + "}"
    return (f"def {name}(*args, **kwargs):\n"
            f"    if args == {args} and kwargs == {kwargs}:\n"
            f"        return {ast.unparse(node.comparators[0])}\n"
            "    return None")


def _special_cases(domain: Domain, prober: Prober, samples: Sequence[Sample]) -> list[Finding]:
    probes: list[tuple[Sample, str]] = []
    for s in samples:
        found = _code_refs(s)
        if found is None or not found[0] or not found[1]:
            continue
        code = special_case(found[0][0])
        if code is not None:
            probes.append((s, fenced(code)))
    if not probes:
        return []
    totals = [_total(sc) for sc in prober.score_many(probes)]
    passing = [(s.id, t) for (s, _), t in zip(probes, totals) if t is not None and t > 0]
    if not passing:
        return []
    accepted = [i for i, t in passing if t > ACCEPT]
    severity: Severity = "error" if accepted else "warning"
    return [Finding("hacking.special_case", severity, domain.name,
                    f"a solution that only special-cases the visible example passes hidden tests on "
                    f"{len(passing)} of {len(probes)} items ({len(accepted)} above {ACCEPT:g}): hidden tests do "
                    "not go beyond the visible example", tuple(i for i, _ in passing),
                    {"passing": len(passing), "accepted": len(accepted), "of": len(probes),
                     "examples": [{"id": i, "total": round(t, 4)} for i, t in passing[:_EXAMPLES]]},
                    "add hidden tests with inputs other than the example's")]

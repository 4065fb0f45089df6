"""Difficulty calibration and label noise, measured with the current model's own samples.

GRPO learns only from groups whose G rewards differ: a prompt the model always solves, or never
does, contributes nothing but generation time (the `add` domain of shared/notes/rl.md had no group
with variance at all). `check_difficulty` samples G completions per item, like a training step
would, and reports the pass-rate histogram, the items and domains without signal, and how many
useful groups a step can expect. `check_label_noise` reads the same samples the other way round:
when most of them agree on one answer the scorer rejects, the reference may be what is wrong.

"Solved" is a reward at or above `pass_threshold` (0.5 by default: the scorer judged the answer more
right than wrong, so a right answer in the wrong format, which shipped domains pay 0.8, counts).
The signal checks do not depend on it: they look only at whether an item's G rewards differ.

`EngineSource` is the `CompletionSource` over our engine: it reuses the trainer's sampler
(`rollout.generate_groups`) so inspection sees exactly the completions training would.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

from mainspring.train.domains.base import Domain, Sample, Score, score_safely
from mainspring.train.domains.extract import first_json_object
from mainspring.train.inspect.findings import CompletionSource, Finding, InspectOptions, items

if TYPE_CHECKING:
    from mainspring.config import Settings

PASS_THRESHOLD = 0.5
FULL_MARKS = 0.999  # a reference "scores full marks" at or above this (float noise of weighted parts)
SAME = 1e-6  # two rewards closer than this are equal (the trainer's zero-variance test is std == 0)
MAX_LISTED = 20  # per-item evidence kept in one finding; item_ids always lists them all
MAX_POINTS = 400  # (length, reward) pairs kept for the reward-vs-length plot
TRAINER_GROUP_SIZES = (2, 4, 8, 16)  # G values the useful-group estimate is given for
PROMPTS_PER_STEP = 4  # TrainConfig's default, for the "useful groups per step" figure


# -- the model's completions -----------------------------------------------------------------------
class _Unscored:
    """generate_groups scores as it samples; the checks score themselves, with their own timeout."""

    def score(self, sample: Sample, completion: str) -> Score:
        return Score(0.0)


class EngineSource:
    """`CompletionSource` over an `LLMEngine`: n samples per prompt at the domain's temperature and
    max tokens, seeded per (seed, prompt, sample) as training is. Results are cached per item, so
    check_difficulty and check_label_noise share one generation."""

    def __init__(self, engine: Any, seed: int = 0, chunk: int = 64) -> None:
        self.engine, self.seed, self.chunk = engine, seed, chunk
        self._cache: dict[tuple[str, str, int, float, int], list[str]] = {}

    def complete(self, domain: Domain, samples: Sequence[Sample], n: int) -> list[list[str]]:
        from mainspring.train.rollout import generate_groups

        s = domain.settings

        def key(x: Sample) -> tuple[str, str, int, float, int]:
            return domain.name, x.id, n, s.temperature, s.max_tokens

        todo = [x for x in samples if key(x) not in self._cache]
        quiet = dataclasses.replace(domain, scorer=_Unscored())
        by_tag = {x.domain: quiet for x in todo} | {domain.name: quiet}
        for start in range(0, len(todo), self.chunk):
            part = todo[start:start + self.chunk]
            groups, _ = generate_groups(self.engine, part, by_tag, n, seed=self.seed, step=0, first_prompt=start)
            for x, g in zip(part, groups):
                self._cache[key(x)] = [c.text for c in g.completions]
        return [list(self._cache[key(x)]) for x in samples]


def engine_source(model: str = "smollm2", *, seed: int = 0, settings: Settings | None = None,
                  threads: int = 0, loaded: Any = None) -> EngineSource:
    """An EngineSource over `model` (a name `load_model` resolves), or over an already `loaded` one."""
    from mainspring.config import get_settings
    from mainspring.engine.config import EngineConfig
    from mainspring.engine.engine import LLMEngine
    from mainspring.engine.loader import load_model

    settings = settings or get_settings()
    loaded = loaded or load_model(model, settings.cache_dir)
    engine = LLMEngine(loaded, EngineConfig(kv_cache_mb=256, max_num_seqs=64, max_num_batched_tokens=2048,
                                            threads=threads or settings.resolved_threads()))
    return EngineSource(engine, seed)


# -- sampling and scoring, shared by both checks ---------------------------------------------------
@dataclass
class ItemSamples:
    sample: Sample
    completions: list[str]
    scores: list[Score]

    @property
    def rewards(self) -> list[float]:
        return [s.total for s in self.scores]

    @property
    def has_signal(self) -> bool:
        r = self.rewards
        return bool(r) and max(r) - min(r) > SAME

    def pass_rate(self, threshold: float) -> float:
        return sum(r >= threshold for r in self.rewards) / max(1, len(self.rewards))

    def useful_probability(self, g: int) -> float:
        """P(a fresh group of g samples has unequal rewards), from this item's empirical reward
        distribution: 1 - sum over reward values of freq^g. Exact for binary rewards."""
        counts = Counter(round(r / SAME) for r in self.rewards)
        n = len(self.rewards)
        return 1.0 - sum((c / n) ** g for c in counts.values()) if n else 0.0


def sample_and_score(domain: Domain, options: InspectOptions, source: CompletionSource,
                     split: str = "train") -> tuple[list[ItemSamples], str | None]:
    """G completions per item, each scored (a failing scorer scores 0 with its reason); the error
    text instead when the source fails or answers with the wrong shape."""
    samples = items(domain, options, split)
    try:
        outs = source.complete(domain, samples, options.samples)
    except Exception as exc:  # the model is a dependency of the check, not of the data: say so, go on
        return [], f"{type(exc).__name__}: {exc}"
    if len(outs) != len(samples):
        return [], f"the completion source returned {len(outs)} groups for {len(samples)} items"
    timeout = options.score_timeout_s
    result = [ItemSamples(s, list(c), [score_safely(domain.scorer, s, t, timeout) for t in c])
              for s, c in zip(samples, outs)]
    return result, None


def _unavailable(check: str, domain: Domain, error: str) -> Finding:
    return Finding(check, "warning", domain.name, f"no model samples, the check did not run: {error}",
                   fix="load a model (mainspring inspect --model NAME) or pass a working completion source")


def _scorer_errors(check: str, domain: Domain, done: list[ItemSamples]) -> list[Finding]:
    failed = [x for x in done if any(s.error for s in x.scores)]
    if not failed:
        return []
    examples = sorted({s.error for x in failed for s in x.scores if s.error})[:3]
    n = sum(1 for x in done for s in x.scores if s.error)
    return [Finding(check, "warning", domain.name,
                    f"the scorer failed on {n} model completions of {len(failed)} items (scored 0)",
                    tuple(x.sample.id for x in failed), {"failures": n, "examples": examples},
                    "fix the scorer: a failure scores 0 and reads as a wrong answer to GRPO")]


# -- difficulty -------------------------------------------------------------------------------------
def check_difficulty(domain: Domain, options: InspectOptions, source: CompletionSource, *,
                     pass_threshold: float = PASS_THRESHOLD) -> list[Finding]:
    """Pass-rate histogram, never/always-solved items, a domain without GRPO signal (error), and the
    share of useful groups per step."""
    done, err = sample_and_score(domain, options, source)
    if err is not None:
        return [_unavailable("difficulty.unavailable", domain, err)]
    if not done:
        return [Finding("difficulty.empty", "warning", domain.name, "no items to calibrate")]
    g = options.samples
    findings = _scorer_errors("difficulty.scorer_errors", domain, done)
    rates = [x.pass_rate(pass_threshold) for x in done]
    never = [x for x, r in zip(done, rates) if r == 0.0]
    always = [x for x, r in zip(done, rates) if r == 1.0]
    useful = [x for x in done if x.has_signal]
    share = len(useful) / len(done)
    # k of G solved -> how many items: exact bins, one per possible pass count
    hist = Counter(round(r * g) for r in rates)
    at_g = {str(k): round(sum(x.useful_probability(k) for x in done) / len(done), 4) for k in TRAINER_GROUP_SIZES}
    evidence = {"items": len(done), "samples_per_item": g, "pass_threshold": pass_threshold,
                "mean_reward": round(sum(sum(x.rewards) / max(1, len(x.rewards)) for x in done) / len(done), 4),
                "mean_pass_rate": round(sum(rates) / len(rates), 4),
                "histogram": {"bins": [round(k / g, 4) for k in range(g + 1)],
                              "counts": [hist[k] for k in range(g + 1)]},
                "useful_share": round(share, 4), "useful_share_at_group_size": at_g,
                "useful_groups_per_step": round(PROMPTS_PER_STEP * at_g["4"], 2),
                "rollouts_per_useful_group": round(1 / share, 2) if share else None}
    findings.append(Finding(
        "difficulty.pass_rate", "info", domain.name,
        f"pass rate {evidence['mean_pass_rate']:.2f} over {len(done)} items x {g} samples; "
        f"{share:.0%} of groups have reward variance", evidence=evidence))
    findings.append(_reward_length(domain, done))
    whole = len(never) == len(done) or len(always) == len(done)
    if whole or not useful:
        # the domain as a whole: GRPO learns nothing here (at most a format from partial credit)
        what = ("every item is always solved" if len(always) == len(done) else
                "no item is ever solved" if len(never) == len(done) else "every item's samples score the same")
        tail = ("all rewards equal within each group" if not useful
                else f"only partial credit varies, in {share:.0%} of groups")
        findings.append(Finding(
            "difficulty.no_signal", "error", domain.name, f"no GRPO signal: {what} ({g} samples per item; {tail})",
            tuple(x.sample.id for x in done), {"items": len(done), "never_solved": len(never),
                                               "always_solved": len(always), "useful_share": round(share, 4)},
            "make the tasks harder or easier for this model (or a partial-credit scorer), or drop the domain"))
        return findings
    if never:
        findings.append(_flag(domain, "difficulty.never_solved", never, g, pass_threshold,
                              f"{len(never)} of {len(done)} items never solved in {g} samples",
                              "check these references, or move them to a later curriculum stage"))
    if always:
        findings.append(_flag(domain, "difficulty.always_solved", always, g, pass_threshold,
                              f"{len(always)} of {len(done)} items solved in all {g} samples",
                              "drop or replace them: they cost generation and give no gradient"))
    if share < 0.25:
        findings.append(Finding(
            "difficulty.low_signal", "warning", domain.name,
            f"only {share:.0%} of groups have reward variance: dynamic sampling will regenerate most of every step",
            tuple(x.sample.id for x in done if not x.has_signal), {"useful_share": round(share, 4)},
            "rebalance difficulty, raise the temperature, or lower this domain's sampling weight"))
    return findings


def _reward_length(domain: Domain, done: list[ItemSamples]) -> Finding:
    """Reward vs length (words) of the model's own samples, the report's scatter. A measurement, not
    a verdict: longer answers may be the complete ones; the length probes decide about hacking."""
    from mainspring.train.inspect.hacking import spearman

    points = [(len(t.split()), r) for x in done for t, r in zip(x.completions, x.rewards)]
    rho = spearman([p[0] for p in points], [p[1] for p in points])
    kept = points[::max(1, -(-len(points) // MAX_POINTS))]  # an even spread keeps the plot readable
    return Finding("difficulty.reward_length", "info", domain.name,
                   f"reward vs length of {len(points)} model samples: Spearman {rho:+.2f}",
                   evidence={"spearman": round(rho, 3), "samples": len(points),
                             "lengths": [p[0] for p in kept], "rewards": [round(p[1], 4) for p in kept]})


def _flag(domain: Domain, check: str, which: list[ItemSamples], g: int, threshold: float, message: str,
          fix: str) -> Finding:
    detail = {x.sample.id: {"rewards": [round(r, 3) for r in x.rewards], "signal": x.has_signal}
              for x in which[:MAX_LISTED]}
    return Finding(check, "warning", domain.name, message, tuple(x.sample.id for x in which),
                   {"count": len(which), "samples_per_item": g, "pass_threshold": threshold, "items": detail}, fix)


# -- label noise ------------------------------------------------------------------------------------
_REFERENCE_KEYS = ("completion", "solution", "answer", "output", "target", "label", "expected")


def reference_text(sample: Sample) -> str | None:
    """The reference written as a completion, where the reference holds one plainly (an answer, a
    solution); None otherwise (then the reference's own score is unknown)."""
    for k in _REFERENCE_KEYS:
        v = sample.reference.get(k)
        if isinstance(v, str) or (isinstance(v, (int, float)) and not isinstance(v, bool)):
            return str(v)
    return None


def normalize(text: str) -> str:
    """What two completions must share to count as the same answer: case, spacing and a final full
    stop do not matter; anything else does (no domain-specific answer extraction)."""
    return " ".join(text.split()).casefold().rstrip(".").strip()


_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:,\d{3})*(?:\.\d+)?(?![\w.]\d)")


def answer_key(text: str) -> str:
    """What two completions must share to give the same answer, judged by the answer's shape, not by
    a domain's own extraction: a JSON object by its canonical form, text with numbers by its last
    number (where a final answer usually stands: "The answer is 7." and "7" agree), other text by
    `normalize`."""
    obj = first_json_object(text)
    if obj is not None:
        return "json:" + json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    numbers = _NUMBER.findall(text)
    if numbers:
        value = float(numbers[-1].replace(",", ""))
        return f"number:{value:.12g}"
    return "text:" + normalize(text)


def check_label_noise(domain: Domain, options: InspectOptions, source: CompletionSource, *,
                      majority: float = 0.5, fail_below: float = PASS_THRESHOLD,
                      reference: Callable[[Sample], str | None] | None = None) -> list[Finding]:
    """Items where more than `majority` of the G samples give the same answer (`answer_key`), that answer scores
    below `fail_below`, and the reference (where it can be written as a completion) scores full
    marks: the samples agree with each other against the label, so the label may be wrong.
    `reference` writes a sample's reference as a completion: default the domain's own
    `reference_completion`, else `reference_text`."""
    reference = reference or getattr(domain, "reference_completion", None) or reference_text
    done, err = sample_and_score(domain, options, source)
    if err is not None:
        return [_unavailable("label_noise.unavailable", domain, err)]
    g = options.samples
    consensus: list[tuple[ItemSamples, str, int, float]] = []
    for x in done:
        if not x.completions:
            continue
        keys = [answer_key(c) for c in x.completions]
        key, k = Counter(keys).most_common(1)[0]
        if key == "text:" or k < 2 or k <= majority * len(x.completions):
            continue
        score = max(s.total for kk, s in zip(keys, x.scores) if kk == key)
        if score < fail_below and not any(s.error for s in x.scores):
            consensus.append((x, key, k, score))
    # an answer the model gives to many different prompts is its habit, not a verdict on one label
    habit = Counter(a for _, a, _, _ in consensus)
    habitual = {a for a, c in habit.items() if c > max(2, 0.1 * len(done))}
    flagged = []
    for x, answer, k, score in consensus:
        if answer in habitual:
            continue
        ref = _safe_reference(reference, x.sample)
        ref_score = None if ref is None else score_safely(domain.scorer, x.sample, ref, options.score_timeout_s).total
        if ref_score is not None and ref_score < FULL_MARKS:
            continue  # the reference fails its own scorer: a verifier defect, reported there
        flagged.append((x, answer, k, score, ref, ref_score))
    if not flagged:
        return []
    def example(x: ItemSamples, key: str) -> str:  # the majority's answer as the model first wrote it
        return next(normalize(c) for c in x.completions if answer_key(c) == key)

    detail = {x.sample.id: {"majority_answer": example(x, a)[:80], "votes": f"{k}/{len(x.completions)}",
                            "majority_score": round(s, 3),
                            "reference": None if r is None else r[:80], "reference_score": rs}
              for x, a, k, s, r, rs in flagged[:MAX_LISTED]}
    return [Finding("label_noise.consensus_disagrees", "warning", domain.name,
                    f"reference may be wrong on {len(flagged)} items: "
                    f"most of {g} samples agree on an answer it rejects",
                    tuple(x.sample.id for x, *_ in flagged),
                    {"count": len(flagged), "samples_per_item": g, "habitual_answers_skipped": sorted(habitual)[:5],
                     "items": detail},
                    "check these references by hand; a wrong label trains the model away from the right answer")]


def _safe_reference(reference: Callable[[Sample], str | None], sample: Sample) -> str | None:
    try:
        ref = reference(sample)
    except Exception:  # a reference that cannot be written is unknown, not a crash (verifier checks report it)
        return None
    return ref if isinstance(ref, str) else None

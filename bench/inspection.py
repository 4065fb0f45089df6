"""Data inspection: time to check 10,000 items for duplicates and leaks, and near-duplicate recall/precision.

The set is generated: prompts of 12-40 words drawn from a Zipf vocabulary (like natural text, common
words repeat), 90% train and 10% eval, each with its own reference. Planted on top, with known ids:
near copies of train items (each word edited with probability 3%, 6% or 10%: a substitution, deletion,
insertion or swap with the next word, at least one edit per copy), exact copies (case and whitespace
changed), and eval items copied into train with the same edits (leaks). The peer is exact-hash dedupe
(casefolded, whitespace collapsed; what `sort | uniq` or a `DISTINCT` gives): it finds the exact copies
and no edited one.

    python bench/inspection.py [--items 10000] [--embeddings] [--out bench/results/inspect.json] [--update-readme]

Not named bench/inspect.py: scripts run from bench/ put it first on sys.path, where that name would
shadow the standard library's `inspect` for every other bench script.
"""

from __future__ import annotations

import os
import sys

# This file is named like the standard library's `inspect`, which dataclasses and torch import: drop its
# folder from the front of the path before anything else is imported, and look there last.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
sys.path.insert(0, os.path.dirname(_HERE))
sys.path.append(_HERE)

import argparse  # noqa: E402
import hashlib  # noqa: E402
import itertools  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from readme_table import write_table  # noqa: E402
from train import cpu_model  # noqa: E402  (bench/train.py: the one CPU-model reader of bench/)

from mainspring.train.domains.base import Domain, Sample, Score  # noqa: E402
from mainspring.train.inspect.dedupe import check_duplicates, normalize  # noqa: E402
from mainspring.train.inspect.findings import InspectOptions  # noqa: E402
from mainspring.train.inspect.leakage import check_leakage  # noqa: E402

ROOT = Path(_HERE).parent
EDIT_RATES = (0.03, 0.06, 0.10)


class Zero:
    def score(self, sample: Sample, completion: str) -> Score:
        return Score(0.0)


def vocabulary(rng: random.Random, n: int = 20000) -> tuple[list[str], list[float]]:
    words = sorted({"".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(2, 10))) for _ in range(n)})
    return words, [1.0 / (r + 1) for r in range(len(words))]  # Zipf: the few common words recur everywhere


def edit(words: list[str], rate: float, rng: random.Random, vocab: list[str]) -> list[str]:
    """Each word edited with probability `rate` (at least one edit): substitution, deletion, insertion, swap."""
    out = list(words)
    spots = [i for i in range(len(out)) if rng.random() < rate] or [rng.randrange(len(out))]
    for i in sorted(spots, reverse=True):
        kind = rng.choice(("sub", "del", "ins", "swap"))
        if kind == "sub":
            out[i] = rng.choice(vocab)
        elif kind == "del" and len(out) > 3:
            del out[i]
        elif kind == "ins":
            out.insert(i, rng.choice(vocab))
        elif i + 1 < len(out):
            out[i], out[i + 1] = out[i + 1], out[i]
    return out


def sample(sid: str, words: list[str], answer: int) -> Sample:
    return Sample(sid, "bench", ({"role": "user", "content": " ".join(words)},), {"answer": answer})


def generate(n: int, seed: int) -> tuple[Domain, dict[str, list[tuple[str, str, float]]]]:
    """A domain of about `n` items with planted copies; truth: kind -> (source id, copy id, edit rate)."""
    rng = random.Random(seed)
    vocab, weights = vocabulary(rng)
    n_eval = n // 10
    n_base = n - n_eval
    near_n, exact_n, leak_n = int(n_base * 0.05), int(n_base * 0.01), int(n_eval * 0.05)
    n_base -= near_n + exact_n + leak_n  # the planted copies count toward the n items
    texts = [rng.choices(vocab, weights, k=rng.randint(12, 40)) for _ in range(n_base + n_eval)]
    train = [sample(f"t{i}", t, i) for i, t in enumerate(texts[:n_base])]
    eval_ = [sample(f"e{i}", t, n_base + i) for i, t in enumerate(texts[n_base:])]
    truth: dict[str, list[tuple[str, str, float]]] = {"near": [], "exact": [], "leak": []}
    for k, src_i in enumerate(rng.sample(range(n_base), near_n + exact_n)):
        src = train[src_i]
        if k < near_n:
            rate = EDIT_RATES[k % len(EDIT_RATES)]
            words = edit(src.prompt_text.split(), rate, rng, vocab)
            kind = "near"
        else:
            rate, words, kind = 0.0, [w.upper() for w in src.prompt_text.split()], "exact"
        train.append(sample(f"{src.id}-{kind}{k}", words, src.reference["answer"]))
        truth[kind].append((src.id, train[-1].id, rate))
    for k, src_i in enumerate(rng.sample(range(n_eval), leak_n)):
        src, rate = eval_[src_i], EDIT_RATES[k % len(EDIT_RATES)]
        train.append(sample(f"{src.id}-leak{k}", edit(src.prompt_text.split(), rate, rng, vocab),
                            src.reference["answer"]))
        truth["leak"].append((src.id, train[-1].id, rate))
    return Domain("bench", train, eval_, Zero()), truth


def exact_hash_pairs(domain: Domain) -> set[frozenset[str]]:
    """The peer: pairs of train items whose normalized text hashes alike."""
    buckets: dict[str, list[str]] = {}
    for s in domain.train:
        buckets.setdefault(hashlib.sha1(normalize(s.prompt_text).encode()).hexdigest(), []).append(s.id)
    return {frozenset(p) for ids in buckets.values() for p in itertools.combinations(ids, 2)}


def scores(found: set[frozenset[str]], truth: list[tuple[str, str, float]]) -> dict[str, float | int]:
    want = {frozenset((a, b)) for a, b, _ in truth}
    hit = len(found & want)
    return {"planted": len(want), "reported_pairs": len(found), "recall": round(hit / max(1, len(want)), 4),
            "precision": round(hit / len(found), 4) if found else 1.0}


def run(n: int, seed: int, embeddings: bool) -> dict:
    domain, truth = generate(n, seed)
    opts = InspectOptions(use_embeddings=embeddings)
    t0 = time.perf_counter()
    dups = check_duplicates(domain, opts)
    t1 = time.perf_counter()
    leaks = check_leakage(domain, opts)
    t2 = time.perf_counter()
    peer = exact_hash_pairs(domain)
    t3 = time.perf_counter()
    # one finding per cluster, then one summary finding whose evidence lists the remaining clusters
    ours = {frozenset(p) for f in dups if f.check in ("data.near_duplicates", "data.exact_duplicates")
            and f.evidence.get("split") == "train"
            for cluster in f.evidence.get("clusters") or [f.item_ids] for p in itertools.combinations(cluster, 2)}
    planted = truth["near"] + truth["exact"]
    by_rate = {}
    for rate in EDIT_RATES:
        rows = [r for r in truth["near"] if r[2] == rate]
        by_rate[f"{rate:.2f}"] = {"ours": scores(ours, rows)["recall"], "exact_hash": scores(peer, rows)["recall"]}
    leak_pairs = {frozenset(p[:2]) for f in leaks if f.check.startswith("data.leak")
                  for p in f.evidence.get("pairs") or ([f.item_ids] if len(f.item_ids) == 2 else [])}
    return {
        "items": len(domain.train) + len(domain.eval), "train": len(domain.train), "eval": len(domain.eval),
        "seconds": {"duplicates": round(t1 - t0, 3), "leakage": round(t2 - t1, 3), "total": round(t2 - t0, 3),
                    "exact_hash": round(t3 - t2, 4)},
        "dedupe": {"ours": scores(ours, planted), "exact_hash": scores(peer, planted), "recall_by_edit_rate": by_rate},
        "leak": {"ours": scores(leak_pairs, truth["leak"]), "exact_hash": scores(set(), truth["leak"])},
        "embeddings": embeddings,
    }


def calibration(n_items: int, g: int, domain_name: str = "math") -> dict:
    """What difficulty calibration costs per item: G completions of the embedded model + scoring."""
    from mainspring.train.config import DomainSpec
    from mainspring.train.domains.registry import load_domain
    from mainspring.train.inspect.difficulty import check_difficulty, engine_source

    domain = load_domain(DomainSpec(name=domain_name))
    t0 = time.perf_counter()
    source = engine_source()
    t1 = time.perf_counter()
    check_difficulty(domain, InspectOptions(samples=g, max_items=n_items, use_embeddings=False), source)
    t2 = time.perf_counter()
    return {"domain": domain_name, "items": n_items, "samples": g, "load_s": round(t1 - t0, 2),
            "seconds": round(t2 - t1, 2), "per_item_s": round((t2 - t1) / n_items, 3)}


def markdown(report: dict) -> str:
    r = report["result"]
    ours, peer = r["dedupe"]["ours"], r["dedupe"]["exact_hash"]
    sec = r["seconds"]
    rates = " · ".join(f"{k}: {v['ours']:.2f} vs {v['exact_hash']:.2f}"
                       for k, v in r["dedupe"]["recall_by_edit_rate"].items())
    return "\n".join([
        "| measure | `mainspring inspect` (MinHash LSH + checks) | exact-hash dedupe | ratio |", "|---|---|---|---|",
        f"| time, {r['items']:,} items: duplicates + leakage | "
        f"{sec['total']} s ({sec['duplicates']} + {sec['leakage']}) | "
        f"{sec['exact_hash']} s (duplicates only) | {sec['total'] / max(sec['exact_hash'], 1e-6):.0f}× slower |",
        f"| duplicate recall ({ours['planted']} planted copies, edited or exact) | "
        f"{ours['recall']:.3f} | {peer['recall']:.3f} | "
        f"{ours['recall'] / peer['recall'] if peer['recall'] else float('inf'):.1f}× |",
        f"| duplicate precision | {ours['precision']:.3f} | {peer['precision']:.3f} | — |",
        f"| leak recall ({r['leak']['ours']['planted']} edited eval copies in train) | "
        f"{r['leak']['ours']['recall']:.3f} | "
        f"{r['leak']['exact_hash']['recall']:.3f} | — |",
        *([f"| difficulty calibration, `{c['domain']}`: G={c['samples']} completions of the embedded model + scoring "
            f"| {c['per_item_s']} s per item ({c['items']} items, {c['seconds']} s; "
            f"model load {c['load_s']} s) | — | — |"]
          if (c := report.get("calibration")) else []),
        f"\nRecall by per-word edit rate (ours vs exact hash): {rates}. "
        "Generated Zipf-vocabulary prompts of 12-40 words; "
        f"embeddings {'on' if r['embeddings'] else 'off'}. {report['cpu']}, {report['cores']} cores, load average "
        f"{report['loadavg_1m']}; `{report['command']}`"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--items", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--embeddings", action="store_true", help="also embed with MiniLM (slow on CPU)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "inspect.json"))
    ap.add_argument("--update-readme", action="store_true")
    ap.add_argument("--calibration-items", type=int, default=16, help="items for the calibration cost (0: skip)")
    ap.add_argument("--samples", type=int, default=8, help="G, completions per item, for the calibration cost")
    args = ap.parse_args()
    if args.update_readme:
        write_table("inspect", args.out, markdown)
        return
    report = {"result": run(args.items, args.seed, args.embeddings), "cpu": cpu_model(), "cores": os.cpu_count(),
              "loadavg_1m": round(os.getloadavg()[0], 2),
              "command": "python bench/inspection.py " + " ".join(sys.argv[1:])}
    if args.calibration_items > 0:
        report["calibration"] = calibration(args.calibration_items, args.samples)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(markdown(report))


if __name__ == "__main__":
    main()

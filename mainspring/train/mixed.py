"""Mixed prompts: one JSONL file of prompts for several domains (the hierarchical reward's entry).

A line's `domain` field tags it; untagged lines go through the domain router (MiniLM embeddings +
a classifier fitted on the run's domains), and then to that domain's scorer, so their other
fields are what that scorer reads (e.g. `answer` for math). Lines join their domain's train or
eval split (`split`, or the same hashed 80/20 as user domains). Same line format as user.py.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from mainspring.train.domains.base import Domain, DomainError
from mainspring.train.domains.user import load_samples


@dataclasses.dataclass
class MixedReport:
    tagged: int
    routed: dict[str, int]  # domain -> untagged lines routed there
    router: dict | None  # the router's accuracy on the domains' held-out prompts (when one was fitted)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def add_mixed(path: str | Path, domains: dict[str, Domain], seed: int = 0) -> MixedReport:
    """Route the file's prompts into `domains` (in place); the router is fitted only if needed."""
    train, eval_ = load_samples(path, "mixed", require_splits=False)
    lines = [(s, "train") for s in train] + [(s, "eval") for s in eval_]
    tagged, untagged = [], []
    for sample, split in lines:
        tag = sample.reference.pop("domain", None)
        if tag is None:
            untagged.append((sample, split))
            continue
        if tag not in domains:
            raise DomainError(f"{path}: sample {sample.id!r} is tagged {tag!r}, which is not a domain of this run "
                              f"({', '.join(domains)})")
        tagged.append((dataclasses.replace(sample, domain=tag), split))
    routed: dict[str, int] = {}
    report = None
    if untagged:
        from mainspring.train.router import DomainRouter

        router = DomainRouter.fit(domains, seed)
        report = router.eval_report(domains).to_dict()
        for (sample, split), (name, _) in zip(untagged, router.classify([s.prompt_text for s, _ in untagged])):
            tagged.append((dataclasses.replace(sample, domain=name), split))
            routed[name] = routed.get(name, 0) + 1
    for sample, split in tagged:
        d = domains[sample.domain]
        target = d.train if split == "train" else d.eval
        mine = dataclasses.replace(sample, id=f"mixed:{sample.id}")
        if any(s.id == mine.id for s in target):
            raise DomainError(f"{path}: sample id {sample.id!r} appears twice")
        target.append(mine)
    return MixedReport(len(lines) - len(untagged), routed, report)

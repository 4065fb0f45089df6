"""Which domain a prompt belongs to: its declared tag if it has one, else a classifier.

The classifier is multinomial logistic regression over all-MiniLM-L6-v2 embeddings of the
prompt's user text, fitted on the domains' train splits: full-batch, zero-initialised, a fixed
number of Adam steps, so a fit is a pure function of the data and the seed (which only picks the
prompts when a domain has more than `max_per_domain`). Classes are weighted by inverse frequency,
so a domain with 28 prompts is not drowned by one with 256.

    router = DomainRouter.fit(domains, seed=0)
    router.route(sample)            # ("math", 1.0) when tagged, else the classifier's guess
    router.evaluate(held_out)       # accuracy and confusion on the eval splits, tags ignored
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import torch
import torch.nn.functional as F

from mainspring.embeddings import EmbeddingModel
from mainspring.train.domains.base import Domain, DomainError, Sample


@dataclass
class RouterReport:
    accuracy: float
    n: int
    per_domain: dict[str, float]  # recall: the share of a domain's prompts routed to it
    confusion: dict[str, dict[str, int]]  # true domain -> routed domain -> count
    mistakes: list[tuple[str, str, str]] = field(default_factory=list)  # (text, true, routed), a few

    def to_dict(self) -> dict:
        return {"accuracy": self.accuracy, "n": self.n, "per_domain": self.per_domain, "confusion": self.confusion,
                "mistakes": [list(m) for m in self.mistakes]}


class DomainRouter:
    def __init__(self, names: list[str], weight: torch.Tensor, bias: torch.Tensor, embedder: EmbeddingModel):
        self.names = names
        self.weight, self.bias = weight, bias  # [dim, k], [k]
        self.embedder = embedder

    @classmethod
    def fit(cls, domains: Mapping[str, Domain], seed: int = 0, *, embedder: EmbeddingModel | None = None,
            max_per_domain: int = 256, steps: int = 300, lr: float = 0.05,
            weight_decay: float = 1e-4) -> DomainRouter:
        """A classifier over the domains' train prompts (at least two domains)."""
        if len(domains) < 2:
            raise DomainError(f"routing needs at least two domains, got {list(domains)}")
        embedder = embedder or EmbeddingModel.load()
        names = list(domains)
        texts, labels = [], []
        for k, name in enumerate(names):
            prompts = [s.prompt_text for s in domains[name].train]
            if len(prompts) > max_per_domain:
                prompts = random.Random(f"router:{seed}:{name}").sample(prompts, max_per_domain)
            texts += prompts
            labels += [k] * len(prompts)
        x, y = embedder.embed(texts), torch.tensor(labels)
        counts = torch.bincount(y, minlength=len(names)).float()
        class_weight = counts.sum() / (len(names) * counts)
        weight = torch.zeros(x.shape[1], len(names), requires_grad=True)
        bias = torch.zeros(len(names), requires_grad=True)
        opt = torch.optim.Adam([weight, bias], lr=lr, weight_decay=weight_decay)
        with torch.enable_grad():
            for _ in range(steps):
                opt.zero_grad()
                F.cross_entropy(x @ weight + bias, y, weight=class_weight).backward()
                opt.step()
        return cls(names, weight.detach(), bias.detach(), embedder)

    # -- routing ------------------------------------------------------------------------------
    def classify(self, texts: Sequence[str]) -> list[tuple[str, float]]:
        """The classifier's (domain, probability) for each text, tags not consulted."""
        if not texts:
            return []
        probs = torch.softmax(self.embedder.embed(list(texts)) @ self.weight + self.bias, dim=-1)
        best = probs.max(dim=-1)
        return [(self.names[i], float(p)) for p, i in zip(best.values.tolist(), best.indices.tolist())]

    def route(self, item: Sample | str) -> tuple[str, float]:
        """(domain, confidence): a sample's own domain tag wins (confidence 1.0); an untagged
        sample (empty tag) or bare text goes to the classifier."""
        return self.route_many([item])[0]

    def route_many(self, items: Sequence[Sample | str]) -> list[tuple[str, float]]:
        """`route` for a batch, embedding the untagged ones together."""
        out: list[tuple[str, float] | None] = [None] * len(items)
        untagged: list[int] = []
        for i, item in enumerate(items):
            if isinstance(item, Sample) and item.domain:
                if item.domain not in self.names:
                    raise DomainError(f"sample {item.id!r} is tagged {item.domain!r}, which is not a domain of "
                                      f"this run ({', '.join(self.names)})")
                out[i] = (item.domain, 1.0)
            else:
                untagged.append(i)
        texts = [item.prompt_text if isinstance(item, Sample) else item for item in (items[i] for i in untagged)]
        for i, routed in zip(untagged, self.classify(texts)):
            out[i] = routed
        return out  # type: ignore[return-value]

    def evaluate(self, held_out: Mapping[str, Sequence[Sample]] | Sequence[Sample]) -> RouterReport:
        """Classifier accuracy on labelled prompts (a domain -> samples map, or samples whose tag is
        the truth), ignoring the tags when routing."""
        if isinstance(held_out, Mapping):
            pairs = [(s.prompt_text, name) for name, samples in held_out.items() for s in samples]
        else:
            pairs = [(s.prompt_text, s.domain) for s in held_out]
        if not pairs:
            raise DomainError("nothing to evaluate the router on")
        routed = self.classify([text for text, _ in pairs])
        truths = list(dict.fromkeys(t for _, t in pairs))
        confusion = {t: {n: 0 for n in self.names} for t in truths}
        mistakes: list[tuple[str, str, str]] = []
        for (text, truth), (name, _) in zip(pairs, routed):
            confusion[truth][name] += 1
            if name != truth and len(mistakes) < 10:
                mistakes.append((text[:120], truth, name))
        correct = sum(confusion[t].get(t, 0) for t in truths)
        per_domain = {t: confusion[t].get(t, 0) / sum(confusion[t].values()) for t in truths}
        return RouterReport(correct / len(pairs), len(pairs), per_domain, confusion, mistakes)

    def eval_report(self, domains: Mapping[str, Domain]) -> RouterReport:
        """`evaluate` on the domains' eval splits."""
        return self.evaluate({name: d.eval for name, d in domains.items()})

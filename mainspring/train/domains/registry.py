"""Domains by name: the shipped ones, or a user's from a data file and a scorer (see user.py for
the data format and user_scorer.py for scorers).

    load_domain(DomainSpec(name="math", temperature=1.0, train_size=64), seed=0)
    load_domain(DomainSpec(name="support", data="support.jsonl", scorer="mypkg.rewards:score"))

A spec's unset knobs keep the domain's own settings; `train_size` / `eval_size` keep the first
prompts of each split (the eval split of a shipped domain does not depend on the seed).
`scorer` without `data` replaces a shipped domain's scorer over its own prompts.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Callable, Iterable

from mainspring.train.config import DomainSpec
from mainspring.train.domains import (answer_style, arithmetic, finance_tables, json_fields, python_functions,
                                      scene_json)
from mainspring.train.domains.base import Domain, DomainError, DomainSettings
from mainspring.train.domains.user import user_domain
from mainspring.train.domains.user_scorer import load_scorer

if TYPE_CHECKING:
    from mainspring.sandbox import Sandbox

_BUILDERS: dict[str, Callable[[int], Domain]] = {
    "json": json_fields.build,
    "math": arithmetic.build,
    "code": python_functions.build,
    "scene": scene_json.build,
    "finance": finance_tables.build,
    "terse": answer_style.build_terse,
    "verbose": answer_style.build_verbose,
}
# terse and verbose conflict by design (the interference demo): loadable by name, not by default
DEFAULT = ("json", "math", "code", "scene", "finance")
_SETTINGS = ("max_tokens", "temperature", "loss_weight", "lr_scale", "sampling_weight")


def builtin_names() -> list[str]:
    """Every shipped domain's name."""
    return list(_BUILDERS)


def default_names() -> list[str]:
    """The shipped domains a run uses when it names none."""
    return list(DEFAULT)


def load_domain(spec: DomainSpec, seed: int = 0, *, sandbox: Sandbox | None = None) -> Domain:
    """The domain `spec` names, with its overrides applied. `sandbox` serves the code domain
    (default: the process-wide one). Raises DomainError for an unknown name or unusable data."""
    if spec.data is not None:
        if not spec.scorer:
            raise DomainError(f"domain {spec.name!r}: a data file needs a scorer "
                              "(\"package.module:function\" or an http(s) URL)")
        settings = DomainSettings()  # a user domain named like a shipped one is not that one: no inherited knobs
        domain = user_domain(spec.name, spec.data, load_scorer(spec.scorer, settings.score_timeout_s), settings)
    elif spec.name in _BUILDERS:
        # only the code domain needs a host resource; the others are pure functions of the seed
        domain = (python_functions.build(seed, sandbox=sandbox) if spec.name == "code"
                  else _BUILDERS[spec.name](seed))
        if spec.scorer:
            domain.scorer = load_scorer(spec.scorer, domain.settings.score_timeout_s)
    else:
        raise DomainError(f"unknown domain {spec.name!r}: shipped domains are {', '.join(_BUILDERS)}; "
                          "a domain of your own needs `data` (a JSONL file) and `scorer`")
    return _apply(domain, spec)


def load_domains(specs: Iterable[DomainSpec], seed: int = 0, *, sandbox: Sandbox | None = None) -> dict[str, Domain]:
    """Every spec's domain by name, in the specs' order; DomainError on a name given twice."""
    out: dict[str, Domain] = {}
    for spec in specs:
        if spec.name in out:
            raise DomainError(f"domain {spec.name!r} is listed twice")
        out[spec.name] = load_domain(spec, seed, sandbox=sandbox)
    return out


def _apply(domain: Domain, spec: DomainSpec) -> Domain:
    overrides = {k: getattr(spec, k) for k in _SETTINGS if getattr(spec, k) is not None}
    domain.settings = dataclasses.replace(domain.settings, **overrides)
    if spec.train_size is not None:
        domain.train = domain.train[:spec.train_size]
    if spec.eval_size is not None:
        domain.eval = domain.eval[:spec.eval_size]
    return domain

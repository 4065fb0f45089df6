"""A user's scorer from a reference: "package.module:function" or an http(s) URL.

A function is called as `function(sample, completion)` and may return a float (the total), a
`Score`, or a dict {"total": float, "parts": {name: float}}. A URL is POSTed the JSON
{"sample": {"id", "domain", "messages", "reference"}, "completion": str} and must answer 2xx with
{"total": float, "parts": {...}} (parts optional) within the domain's score timeout.

Problems found at load time (a malformed reference, a module or function that does not exist)
are DomainErrors; problems while scoring (a raise, a bad return, an HTTP error) are exceptions
that `score_safely` turns into a zero with the reason.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
from typing import Any, Callable

import httpx
from pydantic import BaseModel, ValidationError

from mainspring.train.domains.base import DomainError, Sample, Score, Scorer

_CALLABLE_REF = re.compile(r"^[A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")


class _ScoreBody(BaseModel):
    total: float
    parts: dict[str, float] = {}


def as_score(value: Any, where: str) -> Score:
    """A scorer's return value as a Score; TypeError naming `where` if it is none of the accepted forms."""
    if isinstance(value, Score):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return Score(float(value))
    if isinstance(value, dict):
        try:
            body = _ScoreBody.model_validate(value)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
            raise TypeError(f"{where} returned a malformed score ({problems})") from None
        return Score(body.total, dict(body.parts))
    raise TypeError(f"{where} returned {type(value).__name__}; expected a float, a Score or "
                    "{\"total\": ..., \"parts\": {...}}")


class FunctionScorer:
    def __init__(self, function: Callable[[Sample, str], Any], ref: str):
        self.function, self.ref = function, ref

    def score(self, sample: Sample, completion: str) -> Score:
        return as_score(self.function(sample, completion), f"scorer {self.ref}")


class HttpScorer:
    """POSTs each completion to a scorer service; one connection pool, shared by the scoring threads."""

    def __init__(self, url: str, timeout_s: float):
        self.url = url
        self.client = httpx.Client(timeout=timeout_s, follow_redirects=False)

    def score(self, sample: Sample, completion: str) -> Score:
        body = {"sample": dataclasses.asdict(sample), "completion": completion}
        response = self.client.post(self.url, json=body)
        if response.status_code // 100 != 2:
            raise RuntimeError(f"scorer {self.url} answered HTTP {response.status_code}: {response.text[:200]}")
        try:
            value = response.json()
        except ValueError:
            raise RuntimeError(f"scorer {self.url} answered with a body that is not JSON: {response.text[:200]!r}")
        return as_score(value, f"scorer {self.url}")

    def close(self) -> None:
        self.client.close()


def load_scorer(ref: str, timeout_s: float = 30.0) -> Scorer:
    """The scorer a reference names; DomainError if it is malformed or names nothing importable."""
    if ref.startswith(("http://", "https://")):
        try:
            host = httpx.URL(ref).host
        except httpx.InvalidURL as exc:
            raise DomainError(f"scorer URL {ref!r} is not valid: {exc}") from None
        if not host:
            raise DomainError(f"scorer URL {ref!r} has no host")
        return HttpScorer(ref, timeout_s)
    if not _CALLABLE_REF.match(ref):
        raise DomainError(f"scorer {ref!r}: expected \"package.module:function\" or an http(s) URL")
    module_name, function_name = ref.split(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise DomainError(f"scorer {ref!r}: no module named {exc.name or module_name!r}") from None
    except Exception as exc:  # the user's module failed while importing: say how, at load time
        raise DomainError(f"scorer {ref!r}: importing {module_name} raised {type(exc).__name__}: {exc}") from None
    function = getattr(module, function_name, None)
    if function is None:
        raise DomainError(f"scorer {ref!r}: module {module_name} has no {function_name!r}")
    if not callable(function):
        raise DomainError(f"scorer {ref!r}: {function_name} is not callable (it is {type(function).__name__})")
    return FunctionScorer(function, ref)

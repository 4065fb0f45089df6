"""OpenAI's reinforcement fine-tuning graders: the JSON a job names, checked once, and evaluated per sample.

Types (field names as in OpenAI's API): `string_check` (operation eq | ne | like | ilike), `text_similarity`
(evaluation_metric: see similarity.py), `python` (source defining `grade(sample, item) -> float`, run in the
sandbox) and `multi` (named sub-graders combined by the `calculate_output` formula). `score_model` and
`label_model` need a judge model and are refused with a clear message.

Templates: "{{ sample.output_text }}", "{{ sample.output_json.answer }}", "{{ item.answer }}", "{{ item.tags[0] }}".
`sample` is what the model wrote (output_text, and output_json when it is JSON); `item` is the data set line
(every field, messages included). A template naming something absent fails that sample (score 0, error set).

`GraderScorer(grader)` is the Scorer (domains/base.py) a fine-tuning job trains against.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import cached_property
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from mainspring.train.domains.base import Sample, Score
from mainspring.train.formula import Formula, FormulaError, parse_formula
from mainspring.train.python_grader import PythonGraderError, run_python_grader
from mainspring.train.similarity import METRICS, UNSUPPORTED

MAX_SOURCE_BYTES = 256 * 1024  # OpenAI's limit on a python grader's source
_VAR = re.compile(r"\{\{\s*(.*?)\s*\}\}")
_PATH = re.compile(r"^(sample|item)((?:\.[A-Za-z_][\w-]*|\[\d+\])*)$")
_STEP = re.compile(r"\.([A-Za-z_][\w-]*)|\[(\d+)\]")


class GraderError(ValueError):
    """A grader that cannot be used; the message names the field and the problem."""


class GradeFailed(RuntimeError):
    """One sample could not be graded (a template names something absent, the python grader failed, ...)."""


# ---- templates -----------------------------------------------------------------------------------------
def check_template(text: str) -> str:
    for expr in _VAR.findall(text):
        if not _PATH.match(expr):
            raise ValueError(f"template variable {{{{ {expr} }}}} is not of the form {{{{ sample.<field> }}}} or "
                             "{{ item.<field> }} (nested: .a.b, lists: [0])")
    return text


def lookup(expr: str, namespaces: dict[str, Any]) -> Any:
    m = _PATH.match(expr)
    if m is None:
        raise GradeFailed(f"bad template variable {expr!r}")
    value: Any = namespaces[m.group(1)]
    for key, index in _STEP.findall(m.group(2)):
        try:
            value = value[int(index)] if index else value[key]
        except (KeyError, IndexError, TypeError):
            raise GradeFailed(f"{{{{ {expr} }}}}: the {m.group(1)} has no such field") from None
    return value


def render(text: str, namespaces: dict[str, Any]) -> str:
    def one(m: re.Match) -> str:
        v = lookup(m.group(1), namespaces)
        return v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)

    return _VAR.sub(one, text)


# ---- the grader objects ---------------------------------------------------------------------------------
class _Grader(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(min_length=1, max_length=256)


class StringCheckGrader(_Grader):
    type: Literal["string_check"] = "string_check"
    input: str
    reference: str
    operation: Literal["eq", "ne", "like", "ilike"]

    @field_validator("input", "reference")
    @classmethod
    def _templates(cls, v: str) -> str:
        return check_template(v)


class TextSimilarityGrader(_Grader):
    type: Literal["text_similarity"] = "text_similarity"
    input: str
    reference: str
    evaluation_metric: str
    pass_threshold: float | None = None  # evals' pass/fail line; the reward is the metric itself

    @field_validator("input", "reference")
    @classmethod
    def _templates(cls, v: str) -> str:
        return check_template(v)

    @field_validator("evaluation_metric")
    @classmethod
    def _metric(cls, v: str) -> str:
        if v in UNSUPPORTED:
            raise ValueError(f"evaluation_metric {v!r} is not supported by this server ({UNSUPPORTED[v]}); "
                             f"use one of {', '.join(METRICS)}")
        if v not in METRICS:
            raise ValueError(f"unknown evaluation_metric {v!r}; use one of {', '.join(METRICS)}")
        return v


class PythonGrader(_Grader):
    type: Literal["python"] = "python"
    source: str
    image_tag: str | None = None  # accepted for OpenAI compatibility; our sandbox has one image

    @field_validator("source")
    @classmethod
    def _source(cls, v: str) -> str:
        import ast

        if len(v.encode()) > MAX_SOURCE_BYTES:
            raise ValueError(f"source is larger than {MAX_SOURCE_BYTES // 1024} KB")
        try:
            tree = ast.parse(v)
        except SyntaxError as exc:
            raise ValueError(f"source does not parse: {exc.msg} (line {exc.lineno})") from None
        if not any(isinstance(n, ast.FunctionDef) and n.name == "grade" for n in tree.body):
            raise ValueError("source must define a top-level function grade(sample, item) -> float")
        return v


SubGrader = Annotated[Union[StringCheckGrader, TextSimilarityGrader, PythonGrader], Field(discriminator="type")]


class MultiGrader(_Grader):
    type: Literal["multi"] = "multi"
    graders: dict[str, SubGrader] = Field(min_length=1, max_length=32)
    calculate_output: str

    @field_validator("graders", mode="before")
    @classmethod
    def _subgraders(cls, v: Any) -> Any:
        if not isinstance(v, dict):
            raise ValueError("graders is an object of name -> grader")
        out = {}
        for key, raw in v.items():
            if not re.fullmatch(r"[A-Za-z_]\w*", str(key)):
                raise ValueError(f"grader key {key!r} must be an identifier (calculate_output refers to it)")
            if isinstance(raw, dict) and raw.get("type") == "multi":
                raise ValueError(f"graders.{key}: a multi grader cannot contain another multi grader")
            out[key] = parse_grader(raw, where=f"graders.{key}") if isinstance(raw, dict) else raw
        return out

    @model_validator(mode="after")
    def _formula(self) -> "MultiGrader":
        try:
            parse_formula(self.calculate_output, set(self.graders))
        except FormulaError as exc:
            raise ValueError(str(exc)) from None
        return self

    @cached_property
    def formula(self) -> Formula:
        return parse_formula(self.calculate_output, set(self.graders))


Grader = Union[StringCheckGrader, TextSimilarityGrader, PythonGrader, MultiGrader]
_TYPES: dict[str, type[_Grader]] = {"string_check": StringCheckGrader, "text_similarity": TextSimilarityGrader,
                                    "python": PythonGrader, "multi": MultiGrader}
_JUDGES = ("score_model", "label_model")


def parse_grader(raw: Any, where: str = "grader") -> Grader:
    """The checked grader of an API request; GraderError says what is wrong and where."""
    if not isinstance(raw, dict):
        raise GraderError(f"{where}: a grader is a JSON object with a `type`")
    kind = raw.get("type")
    cls = _TYPES.get(kind)  # type: ignore[arg-type]
    if cls is None:
        if kind in _JUDGES:
            raise GraderError(f"{where}: {kind} graders are not supported by this server (they need a judge model); "
                              f"use {', '.join(_TYPES)}")
        raise GraderError(f"{where}: unknown grader type {kind!r}; use one of {', '.join(_TYPES)}")
    if kind == "multi" and isinstance(raw.get("graders"), dict):  # sub-graders first: their errors name their path
        subs = raw["graders"]
        for key, sub in subs.items():
            if isinstance(sub, dict) and sub.get("type") == "multi":
                raise GraderError(f"{where}.graders.{key}: a multi grader cannot contain another multi grader")
        raw = {**raw, "graders": {k: parse_grader(v, f"{where}.graders.{k}") for k, v in subs.items()}}
    try:
        return cls.model_validate(raw)  # type: ignore[return-value]
    except ValidationError as exc:
        e = exc.errors()[0]
        loc = ".".join(str(p) for p in e["loc"])
        msg = str(e["msg"]).removeprefix("Value error, ")
        raise GraderError(f"{where}{'.' + loc if loc else ''}: {msg}") from None


# ---- evaluation ------------------------------------------------------------------------------------------
@dataclass
class Grade:
    score: float
    parts: dict[str, float] = field(default_factory=dict)  # every grader's own score, by name (multi: by key)


def sample_namespace(output_text: str) -> dict[str, Any]:
    try:
        parsed = json.loads(output_text)
    except ValueError:
        parsed = None
    return {"output_text": output_text, "output_json": parsed if isinstance(parsed, (dict, list)) else None}


def evaluate(grader: Grader, output_text: str, item: dict[str, Any], sandbox: Any = None) -> Grade:
    """Grade one model output against one data set item; raises GradeFailed with the reason."""
    ns = {"sample": sample_namespace(output_text), "item": item}
    if isinstance(grader, MultiGrader):
        parts = {key: _one(g, ns, sandbox) for key, g in grader.graders.items()}
        try:
            return Grade(grader.formula.evaluate(parts), parts)
        except FormulaError as exc:
            raise GradeFailed(str(exc)) from None
    score = _one(grader, ns, sandbox)
    return Grade(score, {grader.name: score})


def _one(grader: Grader, ns: dict[str, Any], sandbox: Any) -> float:
    if isinstance(grader, StringCheckGrader):
        a, b = render(grader.input, ns), render(grader.reference, ns)
        ok = {"eq": a == b, "ne": a != b, "like": b in a, "ilike": b.lower() in a.lower()}[grader.operation]
        return float(ok)
    if isinstance(grader, TextSimilarityGrader):
        return float(METRICS[grader.evaluation_metric](render(grader.input, ns), render(grader.reference, ns)))
    if isinstance(grader, PythonGrader):
        if sandbox is None:
            from mainspring.sandbox import get_sandbox

            sandbox = get_sandbox()
        try:
            return run_python_grader(sandbox, grader.source, ns["sample"], ns["item"])
        except PythonGraderError as exc:
            raise GradeFailed(str(exc)) from None
    raise GradeFailed(f"grader type {grader.type!r} cannot be evaluated here")


class GraderScorer:
    """A job's grader as a training Scorer: the item is the sample's data set line (its reference fields and
    messages); a sample that cannot be graded scores 0 with the reason, as score_safely expects."""

    def __init__(self, grader: Grader, sandbox: Any = None) -> None:
        self.grader, self.sandbox = grader, sandbox

    def score(self, sample: Sample, completion: str) -> Score:
        item = {"messages": [dict(m) for m in sample.messages], **sample.reference}
        try:
            g = evaluate(self.grader, completion, item, self.sandbox)
        except GradeFailed as exc:
            return Score(0.0, error=str(exc))
        return Score(min(1.0, max(0.0, g.score)), {k: min(1.0, max(0.0, v)) for k, v in g.parts.items()})

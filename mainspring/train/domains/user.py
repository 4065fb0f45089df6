"""User domains: your prompts in a JSONL file and your scorer, in a few lines of config.

    domains:
      - name: support
        data: data/support.jsonl
        scorer: mypkg.rewards:score_support      # or https://rewards.internal/score

The data file (a relative path is taken from the current directory) has one JSON object per
line; blank lines are skipped:

    {"id": "q1", "prompt": "Reset my password", "split": "eval", "answer": "Settings > Account"}
    {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]}

- `messages` (chat turns: role system|user|assistant, content) or `prompt` (one user turn), not both;
- `id` (optional): unique in the file; without one, a hash of the messages stands in (so two
  lines with the same prompt need ids);
- `split` (optional): "train" or "eval"; without it, a hash of the id puts about 80% in train,
  the same way on every run and for every seed;
- every other field goes, as it is, into `sample.reference` for the scorer;
- `completion` (optional, a string; it goes into the reference too): what a perfect model would
  reply. `mainspring inspect` checks that it scores full marks and builds wrong answers from it;
  lines without one are left out of those checks.

The scorer is "package.module:function" with `function(sample, completion)` returning a float,
a `Score`, or a dict with "total" and optional "parts"; or an http(s) URL that is POSTed
{"sample": {...}, "completion": "..."} and answers {"total": ..., "parts": {...}}
(see user_scorer.py).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from mainspring.train.domains.base import Domain, DomainError, DomainSettings, Sample, Scorer

TRAIN_PERCENT = 80


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "user", "assistant"]
    content: str


class _Line(BaseModel):
    model_config = ConfigDict(extra="allow")  # the extra fields are the sample's reference
    id: str | int | None = None
    messages: list[_Message] | None = None
    prompt: str | None = None
    split: Literal["train", "eval"] | None = None


def _hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def in_train(sample_id: str) -> bool:
    """The default split: a stable hash of the id, independent of seed and file order."""
    return int(_hash(sample_id)[:8], 16) % 100 < TRAIN_PERCENT


def _parse_line(raw: str, where: str) -> _Line:
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:  # its own "line 1" would be misleading: one line is one document
        raise DomainError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(value, dict):
        raise DomainError(f"{where}: expected a JSON object, got {type(value).__name__}")
    try:
        line = _Line.model_validate(value)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(line)'}: {e['msg']}" for e in exc.errors())
        raise DomainError(f"{where}: {problems}") from None
    if (line.messages is None) == (line.prompt is None):
        raise DomainError(f"{where}: give either \"messages\" or \"prompt\" (exactly one)")
    if line.messages is not None and not any(m.role == "user" for m in line.messages):
        raise DomainError(f"{where}: \"messages\" has no user turn")
    return line


def load_samples(path: str | Path, name: str, require_splits: bool = True) -> tuple[list[Sample], list[Sample]]:
    """(train, eval) samples of the data file; DomainError naming the file and line on any problem.
    `require_splits`: both splits must be non-empty (a domain's own file; mixed prompts join existing ones)."""
    path = Path(path).expanduser()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DomainError(f"domain {name!r}: data file {path} not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise DomainError(f"domain {name!r}: cannot read data file {path}: {exc}") from None
    train: list[Sample] = []
    eval_: list[Sample] = []
    first_line: dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        where = f"domain {name!r}: {path}, line {number}"
        line = _parse_line(raw, where)
        if line.messages is not None:
            messages = tuple({"role": m.role, "content": m.content} for m in line.messages)
        else:
            assert line.prompt is not None  # _parse_line: exactly one of messages and prompt
            messages = ({"role": "user", "content": line.prompt},)
        sample_id = str(line.id) if line.id is not None else "h" + _hash(json.dumps(messages, sort_keys=True))[:12]
        if sample_id in first_line:
            hint = "" if line.id is not None else " (the same prompt as that line: give the lines ids)"
            raise DomainError(f"{where}: duplicate id {sample_id!r}, first on line {first_line[sample_id]}{hint}")
        first_line[sample_id] = number
        reference: dict[str, Any] = dict(line.model_extra or {})
        sample = Sample(sample_id, name, messages, reference)
        split = line.split or ("train" if in_train(sample_id) else "eval")
        (train if split == "train" else eval_).append(sample)
    if not train and not eval_:
        raise DomainError(f"domain {name!r}: data file {path} has no samples")
    for split, samples in (("train", train), ("eval", eval_)):
        if require_splits and not samples:
            raise DomainError(f"domain {name!r}: {path} gives no {split} samples; mark some lines "
                              f"\"split\": \"{split}\" (lines without a split go {TRAIN_PERCENT}/"
                              f"{100 - TRAIN_PERCENT} to train/eval by a hash of their id)")
    return train, eval_


def user_domain(name: str, data: str | Path, scorer: Scorer, settings: DomainSettings | None = None) -> Domain:
    train, eval_ = load_samples(data, name)
    has_reference = any(isinstance(s.reference.get("completion"), str) for s in train + eval_)
    return Domain(name, train, eval_, scorer, settings or DomainSettings(), f"user data from {data}",
                  reference_completion if has_reference else None)


def reference_completion(sample: Sample) -> str:
    """The line's "completion" string; LookupError for a line without one."""
    completion = sample.reference.get("completion")
    if not isinstance(completion, str):
        raise LookupError(f"sample {sample.id!r} has no \"completion\" string")
    return completion

"""A fine-tuning job's data files as a training Domain: JSONL lines -> Samples, the grader -> the scorer.

A line is OpenAI's reinforcement fine-tuning format: `{"messages": [...], <any other fields>}`, the last
message from the user (the model answers it); the other fields are the grader's `item` (Sample.reference).
The validation file is the held-out split; without one, a deterministic tenth of the training lines
(by hash of the line, so the same file always splits the same way) is held out instead.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from mainspring.train.domains.base import Domain, DomainError, DomainSettings, Sample
from mainspring.train.graders import Grader, GraderScorer

MAX_LINES = 50_000
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
HELD_OUT_SHARE = 0.1


class DataFileError(DomainError):
    """A training or validation file that cannot be used; `param` names which."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


def read_samples(path: Path, split: str, domain: str, param: str) -> list[Sample]:
    """Every line of one JSONL file as a Sample; DataFileError names the first bad line."""
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise DataFileError(param, f"the {param} cannot be read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise DataFileError(param, f"the {param} is not UTF-8 JSONL") from None
    samples: list[Sample] = []
    for no, raw in enumerate(text.split("\n"), start=1):
        if not raw.strip():
            continue
        if len(samples) >= MAX_LINES:
            raise DataFileError(param, f"the {param} has more than {MAX_LINES} lines")
        samples.append(_sample(raw, no, split, domain, param))
    if not samples:
        raise DataFileError(param, f"the {param} has no lines")
    return samples


def _sample(raw: str, no: int, split: str, domain: str, param: str) -> Sample:
    where = f"{param} line {no}"
    try:
        obj = json.loads(raw)
    except ValueError as exc:
        raise DataFileError(param, f"{where} is not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise DataFileError(param, f"{where} is not a JSON object")
    messages = obj.get("messages")
    if not isinstance(messages, list) or not messages:
        raise DataFileError(param, f"{where} has no `messages` (a non-empty list of chat messages)")
    out = tuple(_message(m, f"{where}, message {i}", param) for i, m in enumerate(messages))
    if out[-1]["role"] != "user":
        raise DataFileError(param, f"{where}: the last message must be from the user (the model answers it)")
    reference = {k: v for k, v in obj.items() if k != "messages"}
    return Sample(id=f"{split}-{no}", domain=domain, messages=out, reference=reference)


def _message(m: Any, where: str, param: str) -> dict[str, str]:
    if not isinstance(m, dict) or m.get("role") not in ROLES:
        raise DataFileError(param, f"{where}: a message is an object with role {', '.join(ROLES)}")
    content = m.get("content")
    if isinstance(content, list):  # content parts: only text can be trained on
        if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                   for p in content):
            raise DataFileError(param, f"{where}: only text content parts are supported")
        content = "".join(p["text"] for p in content)
    if not isinstance(content, str):
        raise DataFileError(param, f"{where}: content must be a string")
    return {"role": ROLES[m["role"]], "content": content}


def held_out_split(samples: list[Sample]) -> tuple[list[Sample], list[Sample]]:
    """(train, eval): a stable tenth (at least one) held out, chosen by hash, so reruns split alike."""
    if len(samples) < 2:
        raise DataFileError("training_file", "the training_file needs at least 2 lines when no validation_file is "
                            "given (one is held out for evaluation)")
    n_eval = max(1, round(len(samples) * HELD_OUT_SHARE))
    key = lambda s: hashlib.sha256(json.dumps([s.messages, s.reference], sort_keys=True, default=str).encode())  # noqa: E731
    held = {s.id for s in sorted(samples, key=lambda s: key(s).hexdigest())[:n_eval]}
    return [s for s in samples if s.id not in held], [s for s in samples if s.id in held]


def job_domain(name: str, training_file: Path, validation_file: Path | None, grader: Grader, *,
               settings: DomainSettings | None = None, sandbox: Any = None) -> Domain:
    """The Domain a job trains on; DataFileError (a DomainError) if a file is unusable."""
    train = read_samples(training_file, "train", name, "training_file")
    if validation_file is not None:
        held = read_samples(validation_file, "valid", name, "validation_file")
    else:
        train, held = held_out_split(train)
    return Domain(name=name, train=train, eval=held, scorer=GraderScorer(grader, sandbox),
                  settings=settings or DomainSettings(), description=f"fine-tuning job data, graded by {grader.name!r}")

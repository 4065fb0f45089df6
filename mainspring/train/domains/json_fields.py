"""`json`: pull named fields out of one sentence into a JSON object (a person or a book).

Score parts, each in [0, 1]:
- `parses`: the reply contains a JSON object (the first `{...}` that parses; fences and prose allowed);
- `schema`: that object is valid against the record's schema (the right keys, each of its type,
  nothing else) - checked by `check_schema`, a validator for the flat schemas used here;
- `fields`: the fraction of the fields whose value matches the text (strings case-insensitively,
  numbers by value, so "34" for 34 still earns the value but not the schema).
total = 0.2 parses + 0.3 schema + 0.5 fields. The prompts contain no `{`, so an echoed prompt scores 0.
"""

from __future__ import annotations

import json
import random
from typing import Any

from mainspring.train.domains.base import Domain, DomainSettings, Sample, Score
from mainspring.train.domains.extract import first_json_object
from mainspring.train.domains.generated import Item, generated_splits

NAME = "json"
N_TRAIN, N_EVAL = 256, 64

_PEOPLE = ("Maria", "John", "Aiko", "Pedro", "Fatima", "Lukas", "Chen", "Olga", "Amir", "Grace", "Tariq", "Ines",
           "Kofi", "Hana", "Marco", "Priya")
_CITIES = ("Lisbon", "Boston", "Osaka", "Lima", "Cairo", "Berlin", "Toronto", "Oslo", "Madrid", "Nairobi", "Denver",
           "Seoul", "Dublin", "Perth")
_PERSON_TEXTS = (
    "{name} is {age} years old and lives in {city}.",
    "Meet {name}, {age}, from {city}.",
    "{name} ({age}) moved to {city} last year.",
    "Living in {city}, {name} just turned {age}.",
)
_TITLES = ("Blue Harbor", "The Quiet Road", "Paper Moons", "Salt and Iron", "Night Orchard", "The Last Lantern",
           "Winter Glass", "Small Rivers", "The Clockmaker", "Green Thunder")
_AUTHORS = ("Ana Silva", "Tom Reed", "Mei Tanaka", "Raj Patel", "Lena Berg", "Sam Okafor", "Eva Novak", "Dan Cole")
_BOOK_TEXTS = (
    "{title} was written by {author} in {year}.",
    "In {year}, {author} published {title}.",
    "{author} wrote {title}, which came out in {year}.",
)
PERSON_SCHEMA = {"type": "object", "required": ["name", "age", "city"], "additionalProperties": False,
                 "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "city": {"type": "string"}}}
BOOK_SCHEMA = {"type": "object", "required": ["title", "author", "year"], "additionalProperties": False,
               "properties": {"title": {"type": "string"}, "author": {"type": "string"}, "year": {"type": "integer"}}}


def _ask(keys: list[str], numeric: str, text: str) -> str:
    quoted = ", ".join(f'"{k}"' for k in keys)
    return f"Reply with a JSON object with the keys {quoted} ({numeric} as a number) for this text: {text}"


def make(rng: random.Random) -> Item:
    if rng.random() < 0.6:
        fields = {"name": rng.choice(_PEOPLE), "age": rng.randint(18, 80), "city": rng.choice(_CITIES)}
        text = rng.choice(_PERSON_TEXTS).format(**fields)
        return _ask(list(fields), "age", text), {"fields": fields, "schema": PERSON_SCHEMA}
    fields = {"title": rng.choice(_TITLES), "author": rng.choice(_AUTHORS), "year": rng.randint(1950, 2023)}
    text = rng.choice(_BOOK_TEXTS).format(**fields)
    return _ask(list(fields), "year", text), {"fields": fields, "schema": BOOK_SCHEMA}


_TYPES = {"string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,), "object": (dict,),
          "array": (list,)}


def check_schema(value: Any, schema: dict[str, Any]) -> list[str]:
    """Problems of `value` against a flat object schema (type, required, properties' types,
    additionalProperties); [] when valid. Enough JSON Schema for these records, no more."""
    if not _is_type(value, schema.get("type", "object")):
        return [f"expected {schema.get('type')}, got {type(value).__name__}"]
    props = schema.get("properties", {})
    problems = [f"missing {k!r}" for k in schema.get("required", []) if k not in value]
    for key, item in value.items():
        if key in props:
            if not _is_type(item, props[key].get("type")):
                problems.append(f"{key!r} should be {props[key].get('type')}, got {type(item).__name__}")
        elif schema.get("additionalProperties", True) is False:
            problems.append(f"unexpected key {key!r}")
    return problems


def _is_type(value: Any, name: str | None) -> bool:
    if name is None:
        return True
    if isinstance(value, bool) and name in ("integer", "number"):
        return False  # JSON Schema: true is not a number
    if name == "integer" and isinstance(value, float):
        return value.is_integer()
    return isinstance(value, _TYPES[name])


def _same(got: Any, want: Any) -> bool:
    if isinstance(want, int) and not isinstance(got, bool):
        try:
            return float(str(got).strip()) == want
        except ValueError:
            return False
    return isinstance(got, str) and got.strip().casefold() == str(want).casefold()


class JsonFieldsScorer:
    def score(self, sample: Sample, completion: str) -> Score:
        obj = first_json_object(completion)
        if obj is None:
            return Score(0.0, {"parses": 0.0, "schema": 0.0, "fields": 0.0})
        want: dict[str, Any] = sample.reference["fields"]
        schema = float(not check_schema(obj, sample.reference["schema"]))
        fields = sum(_same(obj.get(k), v) for k, v in want.items()) / len(want)
        return Score(0.2 + 0.3 * schema + 0.5 * fields, {"parses": 1.0, "schema": schema, "fields": fields})


def reference_completion(sample: Sample) -> str:
    """The record's fields as one JSON object, nothing else."""
    return json.dumps(sample.reference["fields"])


def build(seed: int = 0) -> Domain:
    train, eval_ = generated_splits(NAME, make, seed, N_TRAIN, N_EVAL)
    return Domain(NAME, train, eval_, JsonFieldsScorer(), DomainSettings(max_tokens=48, temperature=0.7),
                  "extract named fields from a sentence into a JSON object", reference_completion)

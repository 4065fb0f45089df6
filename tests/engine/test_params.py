"""SamplingParams validation: every bad value is an InvalidRequestError naming its parameter."""

from __future__ import annotations

import math

import pytest

from mainspring.engine.errors import InvalidRequestError
from mainspring.engine.params import MAX_LOGPROBS, SamplingParams

INVALID = [
    ("temperature", -0.1),
    ("temperature", 100.5),
    ("temperature", math.nan),
    ("temperature", math.inf),
    ("temperature", "0.5"),
    ("temperature", None),
    ("temperature", True),
    ("top_p", 0.0),
    ("top_p", -0.5),
    ("top_p", 1.01),
    ("top_p", math.nan),
    ("top_p", "1"),
    ("top_k", -2),
    ("top_k", 1.5),
    ("top_k", True),
    ("top_k", None),
    ("min_p", -0.01),
    ("min_p", 1.5),
    ("min_p", math.nan),
    ("repetition_penalty", 0.0),
    ("repetition_penalty", -1.0),
    ("repetition_penalty", math.inf),
    ("repetition_penalty", math.nan),
    ("presence_penalty", -2.5),
    ("presence_penalty", 2.01),
    ("presence_penalty", math.nan),
    ("frequency_penalty", -2.01),
    ("frequency_penalty", 3.0),
    ("frequency_penalty", -math.inf),
    ("max_tokens", 0),
    ("max_tokens", -1),
    ("max_tokens", 10.0),
    ("max_tokens", None),
    ("min_tokens", -1),
    ("min_tokens", 300),  # > max_tokens (256)
    ("min_tokens", 1.0),
    ("stop", [""]),
    ("stop", ["ok", 3]),
    ("stop", 5),
    ("stop_token_ids", [-1]),
    ("stop_token_ids", [1, "2"]),
    ("stop_token_ids", [1.0]),
    ("stop_token_ids", [True]),
    ("stop_token_ids", 7),
    ("ignore_eos", "yes"),
    ("ignore_eos", None),
    ("include_stop_str_in_output", 1),
    ("seed", 1.5),
    ("seed", "42"),
    ("seed", True),
    ("logprobs", -1),
    ("logprobs", MAX_LOGPROBS + 1),
    ("logprobs", 2.0),
    ("logprobs", True),
]


@pytest.mark.parametrize(("name", "value"), INVALID, ids=[f"{n}={v!r}" for n, v in INVALID])
def test_invalid_value_names_parameter(name: str, value: object):
    with pytest.raises(InvalidRequestError, match=rf"\b{name}\b"):
        SamplingParams(**{name: value})


def test_invalid_request_error_is_a_value_error():
    with pytest.raises(ValueError):
        SamplingParams(top_p=2)


VALID = [
    {},
    {"temperature": 0},
    {"temperature": 0.0},
    {"temperature": 100},
    {"temperature": 1e-8},
    {"top_p": 1e-6},
    {"top_p": 1},
    {"top_k": 0},
    {"top_k": 1},
    {"top_k": 10**6},
    {"min_p": 0.0},
    {"min_p": 1.0},
    {"repetition_penalty": 1e-3},
    {"repetition_penalty": 5},
    {"presence_penalty": -2.0, "frequency_penalty": 2.0},
    {"presence_penalty": 2, "frequency_penalty": -2},
    {"max_tokens": 1},
    {"max_tokens": 5, "min_tokens": 5},
    {"min_tokens": 0},
    {"stop": []},
    {"stop": ("a", "bc")},
    {"stop_token_ids": [0, 2, 50000]},
    {"stop_token_ids": (1,)},
    {"seed": 0},
    {"seed": -1},
    {"seed": 2**70},
    {"logprobs": 0},
    {"logprobs": MAX_LOGPROBS},
    {"ignore_eos": True, "include_stop_str_in_output": True},
]


@pytest.mark.parametrize("kwargs", VALID, ids=[repr(k) for k in VALID])
def test_valid_edge_values_pass(kwargs: dict):
    SamplingParams(**kwargs)


def test_normalizations():
    assert SamplingParams(stop="###").stop == ["###"]
    assert SamplingParams(stop=None).stop == []
    assert SamplingParams(stop_token_ids=None).stop_token_ids == []
    assert SamplingParams(stop=("a",)).stop == ["a"]
    assert SamplingParams(top_k=-1).top_k == 0  # vLLM clients send -1 for "off"
    assert SamplingParams(temperature=0).greedy and not SamplingParams().greedy


def test_lists_are_copied():
    stop = ["x"]
    p = SamplingParams(stop=stop)
    stop.append("y")
    assert p.stop == ["x"]


def test_validate_rechecks_after_mutation():
    p = SamplingParams()
    p.top_p = 0.0
    with pytest.raises(InvalidRequestError, match="top_p"):
        p.validate()

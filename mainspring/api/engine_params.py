"""An OpenAI request's sampling fields as the engine's `SamplingParams`: the output budget, the sampling
parameters, logit bias and vLLM's constrained-decoding extras; what the engine cannot honour is a 400 naming
the request field."""

from __future__ import annotations

import json
from typing import Any

from mainspring.api.errors import APIError, bad_request, from_engine_error
from mainspring.api.schemas import SamplingFields
from mainspring.engine.errors import InvalidRequestError
from mainspring.engine.params import SamplingParams


def fit_max_tokens(max_model_len: int, prompt_tokens: int, requested: int | None, prompt_param: str,
                   max_param: str = "max_tokens") -> int:
    """The output budget: what was asked, or what is left of the context after the prompt when
    nothing was. Asking for more than is left is a 400 naming both numbers, as OpenAI answers it: a
    silent clamp would surface later as a confusing error (min_tokens) or a surprising cut."""
    room = max_model_len - prompt_tokens
    if room < 1:
        raise APIError(400, f"This model's maximum context length is {max_model_len} tokens, but the prompt "
                       f"has {prompt_tokens} tokens (and at least one token must be left to generate); "
                       "shorten the prompt", param=prompt_param, code="context_length_exceeded")
    if requested is None:
        return room
    if requested > room:
        raise APIError(400, f"This model's maximum context length is {max_model_len} tokens. However, you "
                       f"requested {prompt_tokens + requested} tokens ({prompt_tokens} in the prompt, {requested} "
                       f"for the output); reduce the prompt or {max_param} (at most {room} here), or leave "
                       f"{max_param} out to use what is left", param=max_param, code="context_length_exceeded")
    return requested


_PARAM_NAMES = {"max_tokens": "max_tokens", "logprobs": "top_logprobs", "stop": "stop", "logit_bias": "logit_bias",
                "attention_window": "attention_window", "attention_sinks": "attention_sinks",
                "kv_hot_tokens": "kv_hot_tokens", "kv_snap_tokens": "kv_snap_tokens"}


def sampling_params(body: SamplingFields, *, max_tokens: int, logprobs: int | None = None,
                    **guided: Any) -> SamplingParams:
    """SamplingParams of an OpenAI request; engine validation errors become 400s naming the field."""
    if body.stream_options is not None and not body.stream:
        raise bad_request("The 'stream_options' parameter is only allowed when 'stream' is enabled.",
                          param="stream_options")
    extras: dict[str, Any]  # mixed int / float fields: each is checked by SamplingParams
    extras = {k: v for k, v in (("top_k", body.top_k), ("min_p", body.min_p),
                                ("repetition_penalty", body.repetition_penalty),
                                ("min_tokens", body.min_tokens), ("attention_window", body.attention_window),
                                ("attention_sinks", body.attention_sinks), ("kv_hot_tokens", body.kv_hot_tokens),
                                ("kv_snap_tokens", body.kv_snap_tokens))
              if v is not None}
    stop = body.stop or []
    try:
        return SamplingParams(
            temperature=body.temperature, top_p=body.top_p, presence_penalty=body.presence_penalty,
            frequency_penalty=body.frequency_penalty, max_tokens=max_tokens,
            stop=[stop] if isinstance(stop, str) else stop,
            seed=body.seed, logprobs=logprobs, logit_bias=_logit_bias(body.logit_bias), **extras, **guided)
    except InvalidRequestError as e:
        raise from_engine_error(e, _PARAM_NAMES) from None


def _logit_bias(raw: dict[str, float] | None) -> dict[int, float] | None:
    """OpenAI's {"<token id>": bias} with string keys -> {token id: bias}; the engine checks the ranges."""
    if not raw:
        return None
    out = {}
    for key, bias in raw.items():
        try:
            token = int(key)
        except ValueError:
            raise bad_request(f"logit_bias keys must be token ids (integers as strings), got {key!r}",
                              param="logit_bias") from None
        out[token] = bias
    return out


def vllm_guided(body: SamplingFields) -> dict[str, Any]:
    """vLLM's constrained-decoding extras as SamplingParams fields: guided_json / guided_regex /
    guided_choice / guided_grammar (Lark) and `structured_outputs` ({"json" | "regex" | "choice" |
    "grammar" | "json_object"}). At most one may be given; what we cannot honour is a 400."""
    given = {k: v for k, v in (("guided_json", body.guided_json), ("guided_regex", body.guided_regex),
                               ("guided_choice", body.guided_choice), ("guided_grammar", body.guided_grammar))
             if v is not None}
    for key in ("guided_whitespace_pattern", "guided_json_object"):
        if (body.model_extra or {}).get(key) is not None:
            raise bad_request(f"{key} is not supported; use guided_json, guided_regex, guided_choice, "
                              "guided_grammar (Lark) or response_format", param=key)
    so = body.structured_outputs
    if so is not None:
        unknown = sorted(set(so) - _STRUCTURED_KEYS)
        if unknown:
            raise bad_request(f"structured_outputs.{unknown[0]} is not supported; give one of "
                              f"{', '.join(sorted(_STRUCTURED_KEYS))}", param="structured_outputs")
        given.update({f"structured_outputs.{k}": v for k, v in so.items() if v is not None and v is not False})
    if len(given) > 1:
        raise bad_request(f"give at most one output constraint, got {', '.join(given)}", param=next(iter(given)))
    if not given:
        return {}
    (name, value), = given.items()
    kind = name.removeprefix("structured_outputs.").removeprefix("guided_")
    if kind == "json_object":
        return {"guided_json_object": True}
    if kind == "choice":
        if not isinstance(value, list) or not value or not all(isinstance(c, str) and c for c in value):
            raise bad_request(f"{name} must be a non-empty list of non-empty strings", param=name.split(".")[0])
        # a Lark alternation of string literals: no regex escaping to get wrong
        return {"guided_grammar": "start: " + " | ".join(json.dumps(c, ensure_ascii=False) for c in value)}
    return {{"json": "guided_json", "regex": "guided_regex", "grammar": "guided_grammar"}[kind]: value}


_STRUCTURED_KEYS = frozenset({"json", "regex", "choice", "grammar", "json_object"})

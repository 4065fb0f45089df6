"""POST /v1/completions: OpenAI's legacy text completion, streamed or not, one or several prompts."""

from __future__ import annotations

import dataclasses
from typing import Any, AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from mainspring.api.errors import APIError, bad_request, error_body
from mainspring.api.routes import (SYSTEM_FINGERPRINT, Generation, finite, Job, choice_jobs, fit_max_tokens, new_id, now,
                                   sampling_params)
from mainspring.api import upstream
from mainspring.api.routes.models import resolve_model
from mainspring.api.schemas import Completion, CompletionChoice, CompletionLogprobs, CompletionRequest, UsageOut
from mainspring.api.sse import DONE, EventStreamResponse, prime, sse_data
from mainspring.engine.outputs import TokenLogprob
from mainspring.engine.tokenizer import Tokenizer

router = APIRouter()
ENDPOINT = "/v1/completions"


def prompt_token_lists(prompt: Any, tokenizer: Tokenizer, vocab_size: int) -> list[list[int]]:
    """str | [str] | [int] | [[int]] -> one token-id list per prompt; empty prompts are a 400."""
    if isinstance(prompt, str):
        prompts: list[Any] = [prompt]
    elif prompt and all(isinstance(t, int) for t in prompt):
        prompts = [prompt]
    else:
        prompts = list(prompt)
    if not prompts:
        raise bad_request("prompt is empty: give a string, a list of strings or token ids", param="prompt")
    out = []
    for k, p in enumerate(prompts):
        ids = tokenizer.encode(p) if isinstance(p, str) else list(p)
        where = "prompt" if len(prompts) == 1 else f"prompt[{k}]"
        if not ids:
            raise bad_request(f"{where} is empty: give at least one token", param=where)
        if any(not 0 <= t < vocab_size for t in ids):
            raise bad_request(f"{where} has token ids outside the vocabulary [0, {vocab_size})", param=where)
        out.append(ids)
    return out


def completion_logprobs(lps: list[TokenLogprob], offset: int) -> CompletionLogprobs:
    """OpenAI's legacy logprobs shape; `offset` is where the first token's text starts."""
    offsets = []
    for lp in lps:
        offsets.append(offset)
        offset += len(lp.token)
    return CompletionLogprobs(tokens=[lp.token for lp in lps], token_logprobs=[finite(lp.logprob) for lp in lps],
                              top_logprobs=[{t.token: finite(t.logprob) for t in lp.top} for lp in lps],
                              text_offset=offsets)


@router.post(ENDPOINT)
async def create_completion(body: CompletionRequest, request: Request) -> Any:
    if upstream.serves(request, body.model):
        return await upstream.proxy(request, body, ENDPOINT)
    model = await resolve_model(request, body.model)
    if body.echo:
        raise bad_request("echo is not supported by this server", param="echo")
    if body.suffix:
        raise bad_request("suffix is not supported by this server", param="suffix")
    if body.best_of is not None and body.best_of != body.n:
        raise bad_request("best_of must equal n (no server-side ranking)", param="best_of")
    eng = model.engine.engine
    prompts = prompt_token_lists(body.prompt, eng.tokenizer, eng.model_config.vocab_size)
    jobs: list[Job] = []
    base = None
    for g, ids in enumerate(prompts):
        max_tokens = fit_max_tokens(model.context_len(body), len(ids), body.max_tokens,
                                    "prompt" if len(prompts) == 1 else f"prompt[{g}]")
        base = sampling_params(body, max_tokens=max_tokens, logprobs=body.logprobs) if base is None \
            else dataclasses.replace(base, max_tokens=max_tokens)
        jobs += choice_jobs(ids, base, body.n, group=g)
    gen = Generation(request, model, ENDPOINT, jobs, stream=body.stream, call_id=new_id("cmpl-"))
    await gen.begin()
    if body.stream:
        return EventStreamResponse(_events(body, gen, await prime(gen.stream())), on_close=gen.aclose)

    outputs = await gen.complete()
    if outputs is None:
        return JSONResponse(error_body(APIError(499, "client closed request"), False), status_code=499)
    choices = [CompletionChoice(index=i, text=out.text, finish_reason=out.finish_reason,
                                logprobs=completion_logprobs(out.logprobs, 0) if out.logprobs is not None else None)
               for i, out in enumerate(outputs)]
    return Completion(id=gen.call_id, created=now(), model=model.id, system_fingerprint=SYSTEM_FINGERPRINT,
                      choices=choices, usage=UsageOut.of(gen.usage()))


async def _events(body: CompletionRequest, gen: Generation, stream: AsyncIterator) -> AsyncIterator[str]:
    created = now()

    def chunk(choices: list[CompletionChoice], usage: UsageOut | None = None) -> str:
        return sse_data(Completion(id=gen.call_id, created=created, model=gen.model.id,
                                   system_fingerprint=SYSTEM_FINGERPRINT, choices=choices, usage=usage))

    lp_sent = [0] * len(gen.jobs)
    offsets = [0] * len(gen.jobs)
    try:
        async for i, out in stream:
            new_lps = out.logprobs[lp_sent[i]:] if out.logprobs is not None else []
            lp_sent[i] += len(new_lps)
            if out.delta_text or new_lps or out.finished:
                lps = completion_logprobs(new_lps, offsets[i]) if out.logprobs is not None else None
                offsets[i] += sum(len(lp.token) for lp in new_lps)
                yield chunk([CompletionChoice(index=i, text=out.delta_text, logprobs=lps,
                                              finish_reason=out.finish_reason if out.finished else None)])
        if body.include_usage:
            yield chunk([], UsageOut.of(gen.usage()))
    except Exception as e:  # headers are sent: report in-band, then end the stream
        err = e if isinstance(e, APIError) else APIError(500, "the engine failed while generating this response")
        yield sse_data(error_body(err, False))
    yield DONE

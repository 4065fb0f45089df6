"""POST /v1/completions: OpenAI's legacy text completion, streamed or not, one or several prompts.

`echo` puts the prompt before the completion, and with `logprobs` scores the prompt's tokens too
(the first has no logprob: nothing precedes it); `max_tokens: 0` then only scores. That is what
evaluation harnesses send for log-likelihoods (lm-eval: echo, max_tokens 0, logprobs).

`suffix` asks for fill-in-the-middle: the prompt is the text before the cursor, the suffix the text after it,
and the completion what goes between (editors' as-you-type completion). The model's own FIM tokens frame the
two (engine/fim.py); a model without them cannot do it, and a non-empty suffix is then a 400.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any, AsyncIterator, Sequence

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from mainspring.api.errors import APIError, bad_request, error_body
from mainspring.api.engine_params import fit_max_tokens, sampling_params, vllm_guided
from mainspring.api.generation import SYSTEM_FINGERPRINT, Generation, Job, choice_jobs, finite, now
from mainspring.api.routes import new_id
from mainspring.api import upstream
from mainspring.api.routes.models import resolve_model
from mainspring.api.schemas import Completion, CompletionChoice, CompletionLogprobs, CompletionRequest, UsageOut
from mainspring.api.sse import DONE, EventStreamResponse, prime, sse_data
from mainspring.engine.fim import FimFormat, fim_format
from mainspring.engine.outputs import RequestOutput, TokenLogprob
from mainspring.engine.tokenizer import Tokenizer

router = APIRouter()
ENDPOINT = "/v1/completions"


def prompt_token_lists(prompt: Any, tokenizer: Tokenizer, vocab_size: int,
                       allow_empty: bool = False) -> list[list[int]]:
    """str | [str] | [int] | [[int]] -> one token-id list per prompt; empty prompts are a 400 unless
    `allow_empty` (a FIM prefix: the cursor at the start of the file)."""
    if isinstance(prompt, str):
        prompts: list[Any] = [prompt]
    elif prompt and all(isinstance(t, int) for t in prompt):
        prompts = [prompt]
    else:
        prompts = list(prompt)
    if not prompts:
        raise bad_request("prompt is empty: give a string, a list of strings or token ids", param="prompt")
    out: list[list[int]] = []
    for k, p in enumerate(prompts):
        if p == "" and allow_empty:
            out.append([])
            continue
        ids = tokenizer.encode(p) if isinstance(p, str) else list(p)
        where = "prompt" if len(prompts) == 1 else f"prompt[{k}]"
        if not ids and not allow_empty:
            raise bad_request(f"{where} is empty: give at least one token", param=where)
        if any(not 0 <= t < vocab_size for t in ids):
            raise bad_request(f"{where} has token ids outside the vocabulary [0, {vocab_size})", param=where)
        out.append(ids)
    return out


def fim_of(body: CompletionRequest, model_id: str, tokenizer: Tokenizer) -> FimFormat | None:
    """The FIM format a request with `suffix` is built in; None for a plain completion (no suffix, or an empty
    one on a model without FIM: nothing follows the cursor, so a plain completion is the same request)."""
    if body.suffix is None:
        return None
    fim = fim_format(tokenizer)
    if fim is None:
        if not body.suffix:
            return None
        raise bad_request(f"The model '{model_id}' has no fill-in-the-middle tokens, so it cannot complete "
                          "between a prompt and a suffix; leave out suffix, or serve a code model trained for "
                          "infilling (StarCoder, Qwen2.5-Coder, DeepSeek-Coder or Code Llama tokens)",
                          param="suffix", code="unsupported_parameter")
    if body.echo:
        raise bad_request("echo cannot be combined with suffix (fill-in-the-middle)", param="echo")
    return fim


def fim_token_lists(body: CompletionRequest, fim: FimFormat, tokenizer: Tokenizer, vocab_size: int) -> list[list[int]]:
    """One PSM prompt per prompt (the text before the cursor), each with the same suffix."""
    suffix = tokenizer.encode(body.suffix or "")
    return [fim.prompt_ids(prefix, suffix)
            for prefix in prompt_token_lists(body.prompt, tokenizer, vocab_size, allow_empty=True)]


def _top(lp: TokenLogprob) -> dict[str, float]:
    # OpenAI: the `logprobs` likeliest tokens and always the sampled one, so logprobs 0 gives just it
    top = {t.token: finite(t.logprob) for t in lp.top}
    top.setdefault(lp.token, finite(lp.logprob))
    return top


def completion_logprobs(lps: list[TokenLogprob], offset: int,
                        prompt: Sequence[tuple[str, TokenLogprob | None]] = ()) -> CompletionLogprobs:
    """OpenAI's legacy logprobs shape; `offset` is where the first token's text starts. `prompt`: an
    echoed prompt's tokens as (text, logprob or None for the first), before the completion's."""
    out = CompletionLogprobs(tokens=[], token_logprobs=[], top_logprobs=[], text_offset=[])
    for text, lp in [*prompt, *((lp.token, lp) for lp in lps)]:
        out.tokens.append(text)
        out.token_logprobs.append(finite(lp.logprob) if lp is not None else None)
        out.top_logprobs.append(_top(lp) if lp is not None else None)
        out.text_offset.append(offset)
        offset += len(text)
    return out


def _echoed(out: RequestOutput, tokenizer: Tokenizer) -> list[tuple[str, TokenLogprob | None]]:
    lps = out.prompt_logprobs or [None] * len(out.prompt_token_ids)
    return [(tokenizer.token_text(t), lp) for t, lp in zip(out.prompt_token_ids, lps)]


def _prompt_texts(prompt: Any, prompts: list[list[int]], tokenizer: Tokenizer) -> list[str]:
    """What echo puts first: each prompt as given, token-id prompts decoded."""
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list) and len(prompt) == len(prompts) and all(isinstance(p, str) for p in prompt):
        return list(prompt)
    return [tokenizer.decode(ids, skip_special_tokens=False) for ids in prompts]


@router.post(ENDPOINT)
async def create_completion(body: CompletionRequest, request: Request) -> Any:
    if upstream.serves(request, body.model):
        return await upstream.proxy(request, body, ENDPOINT)
    model = await resolve_model(request, body.model)
    if body.best_of is not None and body.best_of != body.n:
        raise bad_request("best_of must equal n (no server-side ranking)", param="best_of")
    eng = model.engine.engine
    fim = fim_of(body, model.id, eng.tokenizer)
    if fim is not None:
        prompts = await asyncio.to_thread(fim_token_lists, body, fim, eng.tokenizer, eng.model_config.vocab_size)
    else:
        prompts = await asyncio.to_thread(prompt_token_lists, body.prompt, eng.tokenizer,
                                          eng.model_config.vocab_size)
    # the engine scores prompt tokens for echo + logprobs; max_tokens 0 is "score only" to it
    prompt_logprobs = body.logprobs if body.echo and body.logprobs is not None else None
    if body.max_tokens == 0 and prompt_logprobs is None:
        prompt_logprobs = 0
    extras = {**vllm_guided(body), "prompt_logprobs": prompt_logprobs}
    if fim is not None:  # the model ends its middle with an end token of its FIM training (or EOS)
        extras["stop_token_ids"] = list(fim.stop_ids)
    jobs: list[Job] = []
    base = None
    for g, ids in enumerate(prompts):
        max_tokens = fit_max_tokens(model.context_len(body), len(ids), body.max_tokens,
                                    "prompt" if len(prompts) == 1 else f"prompt[{g}]")
        base = sampling_params(body, max_tokens=max_tokens, logprobs=body.logprobs, **extras) if base is None \
            else dataclasses.replace(base, max_tokens=max_tokens)
        jobs += choice_jobs(ids, base, body.n, group=g)
    echo = _prompt_texts(body.prompt, prompts, eng.tokenizer) if body.echo else None
    gen = Generation(request, model, ENDPOINT, jobs, stream=body.stream, call_id=new_id("cmpl-"))
    await gen.begin()
    if body.stream:
        return EventStreamResponse(_events(body, gen, await prime(gen.stream()), echo, eng.tokenizer),
                                   on_close=gen.aclose)

    outputs = await gen.complete()
    if outputs is None:
        return JSONResponse(error_body(APIError(499, "client closed request"), False), status_code=499)
    choices = []
    for i, out in enumerate(outputs):
        prompt = _echoed(out, eng.tokenizer) if echo is not None and out.logprobs is not None else []
        choices.append(CompletionChoice(
            index=i, text=(echo[gen.jobs[i].group] if echo is not None else "") + out.text,
            finish_reason=out.finish_reason,
            logprobs=completion_logprobs(out.logprobs, 0, prompt) if out.logprobs is not None else None))
    return Completion(id=gen.call_id, created=now(), model=model.id, system_fingerprint=SYSTEM_FINGERPRINT,
                      choices=choices, usage=UsageOut.of(gen.usage()))


async def _events(body: CompletionRequest, gen: Generation, stream: AsyncIterator, echo: list[str] | None,
                  tokenizer: Tokenizer) -> AsyncIterator[str]:
    created = now()

    def chunk(choices: list[CompletionChoice], usage: UsageOut | None = None) -> str:
        return sse_data(Completion(id=gen.call_id, created=created, model=gen.model.id,
                                   system_fingerprint=SYSTEM_FINGERPRINT, choices=choices, usage=usage))

    lp_sent = [0] * len(gen.jobs)
    offsets = [0] * len(gen.jobs)
    echoed = [echo is None] * len(gen.jobs)
    try:
        async for i, out in stream:
            new_lps = out.logprobs[lp_sent[i]:] if out.logprobs is not None else []
            lp_sent[i] += len(new_lps)
            # the first output of a choice comes once its prompt is in: the echo leads its first chunk
            prompt, text = [], out.delta_text
            if not echoed[i]:
                echoed[i] = True
                text = echo[gen.jobs[i].group] + text  # type: ignore[index]
                prompt = _echoed(out, tokenizer) if out.logprobs is not None else []
            if text or new_lps or prompt or out.finished:
                lps = completion_logprobs(new_lps, offsets[i], prompt) if out.logprobs is not None else None
                offsets[i] += sum(len(t) for t, _ in prompt) + sum(len(lp.token) for lp in new_lps)
                yield chunk([CompletionChoice(index=i, text=text, logprobs=lps,
                                              finish_reason=out.finish_reason if out.finished else None)])
        if body.include_usage:
            yield chunk([], UsageOut.of(gen.usage()))
    except Exception as e:  # headers are sent: report in-band, then end the stream
        err = e if isinstance(e, APIError) else APIError(500, "the engine failed while generating this response")
        yield sse_data(error_body(err, False))
    yield DONE

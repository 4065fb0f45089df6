"""The HTTP routes, and what every generation route shares.

A call (one HTTP request) becomes one or more engine requests — `n` choices, several prompts —
run as a `Generation`: it calls the economics hooks around the engine work, merges the engine
streams, keeps the latest output of each choice (so usage is known even for a call cut short),
and aborts its engine requests when the client goes away.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, AsyncIterator

import anyio
from fastapi import APIRouter, Depends, Request

from mainspring import __version__
from mainspring.api import hooks
from mainspring.api.errors import APIError, bad_request, from_engine_error
from mainspring.api.schemas import SamplingFields
from mainspring.engine.errors import InvalidRequestError
from mainspring.engine.outputs import RequestOutput, Usage
from mainspring.engine.params import SamplingParams

if TYPE_CHECKING:
    from mainspring.api.routes.models import ServedModel

log = logging.getLogger(__name__)

SYSTEM_FINGERPRINT = f"fp_mainspring_{__version__}"
_END = object()


async def _authenticate(request: Request) -> None:
    request.state.principal = await hooks.authenticate(request)


def api_router() -> APIRouter:
    """Every /v1 route, each behind `hooks.authenticate`."""
    # imported here: they import this module
    from mainspring.api.routes import chat, completions, embeddings, messages, models, usage
    from mainspring.api.routes import agents, batches, files, fine_tuning, graders, responses, runs

    router = APIRouter(dependencies=[Depends(_authenticate)])
    for module in (models, chat, completions, messages, embeddings, usage, files, batches, fine_tuning, graders,
                   agents, runs, responses):
        router.include_router(module.router)
    return router


def new_id(prefix: str) -> str:
    return prefix + uuid.uuid4().hex[:24]


def now() -> int:
    return int(time.time())


def finite(logprob: float) -> float:
    """JSON has no -inf: OpenAI's stand-in for an impossible token is -9999."""
    return logprob if math.isfinite(logprob) else -9999.0


# ---- request -> engine parameters ---------------------------------------------------------------
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
    extras = {k: v for k, v in (("top_k", body.top_k), ("min_p", body.min_p),
                                ("repetition_penalty", body.repetition_penalty),
                                ("min_tokens", body.min_tokens), ("attention_window", body.attention_window),
                                ("attention_sinks", body.attention_sinks), ("kv_hot_tokens", body.kv_hot_tokens),
                                ("kv_snap_tokens", body.kv_snap_tokens))
              if v is not None}
    try:
        return SamplingParams(
            temperature=body.temperature, top_p=body.top_p, presence_penalty=body.presence_penalty,
            frequency_penalty=body.frequency_penalty, max_tokens=max_tokens, stop=body.stop or [],
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


@dataclass
class Job:
    """One engine request: a prompt (token ids), its parameters, and which prompt it belongs to."""

    prompt_ids: list[int]
    params: SamplingParams
    group: int = 0  # choices of one prompt share a group: usage counts that prompt once


def choice_jobs(prompt_ids: list[int], params: SamplingParams, n: int, group: int = 0) -> list[Job]:
    """n independent choices of one prompt; with a seed, choice i samples with seed + i."""
    if params.seed is None or n == 1:
        return [Job(prompt_ids, params, group) for _ in range(n)]
    return [Job(prompt_ids, dataclasses.replace(params, seed=params.seed + i), group) for i in range(n)]


# ---- running a call --------------------------------------------------------------------------------
class Generation:
    """The engine requests of one API call, between `hooks.before_call` and `hooks.after_call`."""

    def __init__(self, request: Request, model: ServedModel, endpoint: str, jobs: list[Job], *, stream: bool,
                 call_id: str) -> None:
        self.request, self.model, self.jobs, self.call_id = request, model, jobs, call_id
        self.last: list[RequestOutput | None] = [None] * len(jobs)
        groups = {j.group: len(j.prompt_ids) for j in jobs}
        self.info = hooks.CallInfo(
            endpoint=endpoint, model=model.id, tier=model.tier, stream=stream, prompt_tokens=sum(groups.values()),
            max_output_tokens=sum(j.params.max_tokens for j in jobs), num_choices=len(jobs), request_id=call_id)
        self.reservation: Any = None
        self._settled = False
        self._stream: AsyncIterator[tuple[int, RequestOutput]] | None = None

    async def begin(self) -> None:
        """Admission (budgets, rate limits); an APIError raised here is the HTTP answer."""
        self.reservation = await hooks.before_call(self.request, self.info)

    def usage(self) -> Usage:
        """Usage so far: each prompt once (cached: the least any of its choices got), all completions."""
        prompt = cached = completion = 0
        for group in dict.fromkeys(j.group for j in self.jobs):
            idx = [i for i, j in enumerate(self.jobs) if j.group == group]
            prompt += len(self.jobs[idx[0]].prompt_ids)
            started = [self.last[i].usage for i in idx if self.last[i] is not None and self.last[i].usage]
            cached += min((u.cached_tokens for u in started), default=0)
            completion += sum(u.completion_tokens for u in started)
        return Usage(prompt, cached, completion)

    async def settle(self, status: str) -> None:
        """`hooks.after_call`, exactly once; shielded so a cancelled (disconnected) task still records."""
        if self._settled:
            return
        self._settled = True
        outcome = hooks.CallOutcome(status, tuple(o.finish_reason if o else None for o in self.last))
        with anyio.CancelScope(shield=True):
            try:
                await hooks.after_call(self.usage(), self.request, self.info, self.reservation, outcome)
            except Exception:  # the response is decided; a failing recorder must not change it
                log.exception("after_call hook failed for %s", self.call_id)

    def stream(self) -> AsyncIterator[tuple[int, RequestOutput]]:
        """(choice index, output) after every engine step of any choice; settles when it ends."""
        self._stream = self._run()
        return self._stream

    async def aclose(self) -> None:
        if self._stream is not None:
            await self._stream.aclose()  # type: ignore[attr-defined]
        await self.settle("stream_interrupted")  # no-op when the stream already settled

    async def _run(self) -> AsyncIterator[tuple[int, RequestOutput]]:
        # what it is if we are closed before the end: the client broke off the stream / left
        status = "stream_interrupted" if self.info.stream else "cancelled"
        merged = self._merged()
        try:
            async for i, out in merged:
                self.last[i] = out
                yield i, out
            status = "ok"
        except Exception:
            status = "error"
            raise
        finally:
            with anyio.CancelScope(shield=True):
                await merged.aclose()  # type: ignore[attr-defined]  # `async for` does not close it
            await self.settle(status)

    def _engine_stream(self, i: int) -> AsyncIterator[RequestOutput]:
        job = self.jobs[i]
        return self.model.engine.stream(job.prompt_ids, job.params, request_id=f"{self.call_id}-{i}",
                                        priority=self.model.priority)

    async def _merged(self) -> AsyncIterator[tuple[int, RequestOutput]]:
        if len(self.jobs) == 1:
            stream = self._engine_stream(0)
            try:
                async for out in stream:
                    yield 0, out
            finally:
                await stream.aclose()  # type: ignore[attr-defined]
            return
        # n > 1: one task per engine stream feeding a queue; cancelling a task aborts its request
        queue: asyncio.Queue = asyncio.Queue()

        async def pump(i: int) -> None:
            try:
                async for out in self._engine_stream(i):
                    queue.put_nowait((i, out))
                queue.put_nowait((i, _END))
            except Exception as e:
                queue.put_nowait((i, e))

        tasks = [asyncio.create_task(pump(i)) for i in range(len(self.jobs))]
        try:
            remaining = len(tasks)
            while remaining:
                i, item = await queue.get()
                if item is _END:
                    remaining -= 1
                elif isinstance(item, BaseException):
                    raise item
                else:
                    yield i, item
        finally:
            for t in tasks:
                t.cancel()
            with anyio.CancelScope(shield=True):
                await asyncio.gather(*tasks, return_exceptions=True)

    async def complete(self) -> list[RequestOutput] | None:
        """Runs every choice to the end; None if the client disconnected first (requests aborted)."""
        async def consume() -> None:
            async for _ in self.stream():
                pass

        work = asyncio.ensure_future(consume())
        watch = asyncio.ensure_future(_until_disconnected(self.request))
        try:
            await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watch.cancel()
            if not work.done():
                work.cancel()
                await asyncio.gather(work, return_exceptions=True)
        if work.cancelled():
            await self.settle("cancelled")
            return None
        work.result()  # re-raises an engine error (already settled as "error")
        return list(self.last)  # type: ignore[arg-type]


async def _until_disconnected(request: Request) -> None:
    # The body is already read, so the next ASGI message is the disconnect (or nothing, ever).
    while (await request.receive())["type"] != "http.disconnect":
        pass


# ---- a route called in-process (batch lines) -----------------------------------------------------------
async def call_route(app: Any, endpoint: str, body: dict[str, Any], principal: Any = None) -> tuple[int, Any]:
    """POST `body` to the generation route at `endpoint` without HTTP: the same validation, admission,
    engine work and response body (or OpenAI error body) as a real call, as (status code, JSON).

    `app` needs only a `.state` like the real app's (engine, economics, settings): the caller can hand
    in its own engine priority and economics. The request never disconnects; cancel the task to abort.
    """
    import json

    from fastapi.encoders import jsonable_encoder
    from fastapi.exceptions import RequestValidationError
    from pydantic import ValidationError
    from starlette.responses import Response

    from mainspring.api.errors import _validation_error, error_body
    from mainspring.api.routes import chat, completions
    from mainspring.api.schemas import ChatCompletionRequest, CompletionRequest
    from mainspring.engine.errors import EngineError

    handlers = {chat.ENDPOINT: (ChatCompletionRequest, chat.create_chat_completion),
                completions.ENDPOINT: (CompletionRequest, completions.create_completion)}
    schema, handler = handlers[endpoint]

    async def never_disconnects() -> dict:
        await asyncio.Event().wait()
        return {"type": "http.disconnect"}

    request = Request({"type": "http", "method": "POST", "path": endpoint, "headers": [], "query_string": b"",
                       "app": app}, never_disconnects)
    request.state.principal = principal
    try:  # the app's exception handlers, for the exceptions a generation route raises
        try:
            parsed = schema.model_validate(body)
        except ValidationError as e:
            raise _validation_error(RequestValidationError(e.errors(include_url=False))) from None
        result = await handler(parsed, request)
    except APIError as e:
        return e.status, error_body(e, False)
    except InvalidRequestError as e:
        return 400, error_body(from_engine_error(e), False)
    except EngineError as e:
        return 500, error_body(APIError(500, f"the engine could not serve this request: {e}"), False)
    except Exception:
        log.exception("unhandled error in an in-process call to %s", endpoint)
        return 500, error_body(APIError(500, "the server had an internal error while processing this request; "
                                             "it has been logged"), False)
    if isinstance(result, Response):
        return result.status_code, json.loads(bytes(result.body))
    return 200, jsonable_encoder(result)

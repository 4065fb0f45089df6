"""A ChatModel whose every call is an API call of the caller: `hooks.before_call` (rate limits, then the
budget's hold: 429 or 402) before it, `hooks.after_call` (the ledger row under the caller's key, the hold
settled) after it, also when it fails or is cancelled. For routes that drive a model through several calls
of their own, such as a scene design thread's write, edit and repair calls.

A model the price sheet does not list costs nothing and is not metered, as an agent run's is not
(agents/charges.py); it is priced as the caller named it, else as the model that answers. The prompt is
not tokenized before the call: its hold takes the text's length over `CHARS_PER_TOKEN`, settled to the
tokens the call really used.
"""

from __future__ import annotations

import json
from typing import Any, AsyncIterator

import anyio
from fastapi import Request

from mainspring.agents.context import CHARS_PER_TOKEN
from mainspring.api import hooks
from mainspring.engine.outputs import Usage
from mainspring.models import ChatModel, Completion, CompletionChunk

TIER = "standard"


class BilledChat(ChatModel):
    def __init__(self, inner: ChatModel, request: Request, endpoint: str, name: str, call_id: str) -> None:
        self.inner, self.request, self.endpoint, self.call_id = inner, request, endpoint, call_id
        self.model = getattr(inner, "model", name)
        meter = request.app.state.economics.meter
        self.priced = meter.priced(name, self.model)
        self.calls = 0

    async def chat(self, messages: list[Any], **kwargs: Any) -> Completion:
        if self.priced is None:
            return await self.inner.chat(messages, **kwargs)
        self.calls += 1
        info = hooks.CallInfo(endpoint=self.endpoint, model=self.priced, tier=TIER, stream=False,
                              prompt_tokens=len(json.dumps(messages)) // CHARS_PER_TOKEN + 1,
                              max_output_tokens=int(kwargs.get("max_tokens", 1024)),
                              request_id=f"{self.call_id}-{self.calls}")
        reservation = await hooks.before_call(self.request, info)  # an APIError (402, 429) is the route's answer
        done: Completion | None = None
        status = "error"
        try:
            done = await self.inner.chat(messages, **kwargs)
            status = "ok"
            return done
        except BaseException as exc:
            status = "cancelled" if isinstance(exc, anyio.get_cancelled_exc_class()) else "error"
            raise
        finally:
            used = done.usage if done is not None else Usage(0, 0, 0)
            finish = (done.finish_reason,) if done is not None else ()
            with anyio.CancelScope(shield=True):  # a client gone mid-turn still leaves its ledger row
                await hooks.after_call(used, self.request, info, reservation, hooks.CallOutcome(status, finish))

    def stream(self, messages: list[Any], **kwargs: Any) -> AsyncIterator[CompletionChunk]:
        raise NotImplementedError("BilledChat meters whole calls; stream through the API's own routes")

    async def aclose(self) -> None:
        await self.inner.aclose()


__all__ = ["BilledChat"]

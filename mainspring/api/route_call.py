"""A generation route called in-process (batch lines): the same validation, admission, engine work and
answer as an HTTP call, without HTTP."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, Awaitable, Callable

from fastapi import Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError
from starlette.responses import Response

from mainspring.api.errors import APIError, _validation_error, engine_stopped_error, error_body, from_engine_error
from mainspring.api.routes import chat, completions
from mainspring.api.schemas import ChatCompletionRequest, CompletionRequest
from mainspring.engine.errors import EngineError, EngineStoppedError, InvalidRequestError

log = logging.getLogger(__name__)


async def call_route(app: Any, endpoint: str, body: dict[str, Any], principal: Any = None) -> tuple[int, Any]:
    """POST `body` to the generation route at `endpoint` without HTTP: the same validation, admission,
    engine work and response body (or OpenAI error body) as a real call, as (status code, JSON).

    `app` needs only a `.state` like the real app's (engine, economics, settings): the caller can hand
    in its own engine priority and economics. The request never disconnects; cancel the task to abort.
    """
    handlers: dict[str, tuple[type[BaseModel], Callable[[Any, Request], Awaitable[Any]]]] = {
        chat.ENDPOINT: (ChatCompletionRequest, chat.create_chat_completion),
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
    except EngineStoppedError:
        return 503, error_body(engine_stopped_error(), False)
    except EngineError as e:
        return 500, error_body(APIError(500, f"the engine could not serve this request: {e}"), False)
    except Exception:
        log.exception("unhandled error in an in-process call to %s", endpoint)
        return 500, error_body(APIError(500, "the server had an internal error while processing this request; "
                                             "it has been logged"), False)
    if isinstance(result, Response):
        return result.status_code, json.loads(bytes(result.body))
    return 200, jsonable_encoder(result)

"""Every error leaves the server in the body its client library parses.

OpenAI routes answer `{"error": {"message", "type", "param", "code"}}`; the Anthropic route
(/v1/messages) answers `{"type": "error", "error": {"type", "message"}}`. The SDKs pick their
exception class from the status code (400 BadRequestError, 404 NotFoundError, ...), so the status
matters as much as the body: OpenAI reports validation problems as 400, never FastAPI's 422.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException

from mainspring.engine.errors import EngineError, EngineStoppedError, InvalidRequestError
from mainspring.models import ModelStopped
from mainspring.store.db import is_busy_error

log = logging.getLogger(__name__)

# Anthropic names errors by kind rather than by field; these are its documented types per status.
_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 402: "billing_error",
                    403: "permission_error", 404: "not_found_error", 413: "request_too_large",
                    429: "rate_limit_error", 500: "api_error", 503: "overloaded_error", 529: "overloaded_error"}
_OPENAI_TYPES = {401: "authentication_error", 402: "insufficient_quota", 403: "permission_error",
                 429: "rate_limit_error", 500: "server_error", 503: "server_error"}
_PARAM_IN_MESSAGE = re.compile(r"invalid sampling parameter (\w+)=")
BUSY_RETRY_AFTER_S = 2


class APIError(Exception):
    """An error with an HTTP status, raised anywhere below a route and rendered by the handlers here."""

    def __init__(self, status: int, message: str, *, type: str | None = None, param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers or {}
        self.type = type or _OPENAI_TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def from_engine_error(exc: InvalidRequestError, param_names: dict[str, str] | None = None) -> APIError:
    """The engine's InvalidRequestError as a 400; `param_names` maps engine fields to API fields."""
    m = _PARAM_IN_MESSAGE.search(str(exc))
    param = getattr(exc, "param", None) or (m.group(1) if m else None)
    if param and param_names:
        param = param_names.get(param, param)
    return APIError(400, str(exc), param=param)


def is_anthropic(request: Request) -> bool:
    return request.url.path.rstrip("/").endswith("/v1/messages") or "/v1/messages/" in request.url.path


def error_body(err: APIError, anthropic: bool) -> dict[str, Any]:
    if anthropic:
        return {"type": "error", "error": {"type": _ANTHROPIC_TYPES.get(err.status, err.type), "message": err.message}}
    return {"error": {"message": err.message, "type": err.type, "param": err.param, "code": err.code}}


def error_response(request: Request, err: APIError) -> JSONResponse:
    return JSONResponse(error_body(err, is_anthropic(request)), status_code=err.status, headers=err.headers)


_TYPE_TAGS = {"str", "int", "float", "bool", "dict", "list", "none", "json-or-python"}


def _field_path(loc: tuple[Any, ...]) -> str | None:
    """('body', 'messages', 0, 'content', 'list[ContentPart]', 1) -> 'messages[0].content[1]'.

    pydantic puts the union branch it tried into `loc` ('str', 'list[ContentPart]', 'ContentPart');
    those are not fields, and OpenAI's `param` names fields only.
    """
    parts = list(loc[1:] if loc and loc[0] in ("body", "query", "path") else loc)
    out = ""
    for p in parts:
        if isinstance(p, int):
            out += f"[{p}]"
        elif not ("[" in str(p) or str(p) in _TYPE_TAGS or str(p)[:1].isupper()):
            out += ("." if out else "") + str(p)
    return out or None


def _validation_error(exc: RequestValidationError) -> APIError:
    errors = exc.errors()
    if errors and errors[0].get("type") == "json_invalid":
        ctx = errors[0].get("ctx") or {}
        return APIError(400, f"the request body is not valid JSON ({ctx.get('error', 'parse error')}); "
                        "send a JSON object with Content-Type: application/json", code="invalid_json")
    if not errors:
        return APIError(400, "invalid request", code="invalid_value")
    # Report the first field. A union field fails once per branch; the branch that got deepest
    # (e.g. into a content part) names the actual problem.
    paths = [_field_path(tuple(e.get("loc", ()))) or "" for e in errors]

    def within_first(p: str) -> bool:
        return not paths[0] or p == paths[0] or p.startswith((paths[0] + ".", paths[0] + "["))

    same_field = [i for i, p in enumerate(paths) if within_first(p)]
    pick = max(same_field, key=lambda i: len(paths[i]))
    err, param = errors[pick], paths[pick] or None
    kind = err.get("type")
    if kind == "missing":
        msg = f"missing required parameter: '{param}'" if param else "the request body is missing"
    else:
        msg = f"invalid value for '{param}': {err.get('msg', 'invalid')}" if param else err.get("msg", "invalid")
    others = len({p for p in paths if not within_first(p)})
    if others:
        msg += f" (and {others} more invalid parameter{'s' if others > 1 else ''})"
    return APIError(400, msg, param=param, code="missing_required_parameter" if kind == "missing" else "invalid_value")


def _http_error(exc: StarletteHTTPException) -> APIError:
    detail = exc.detail
    if isinstance(detail, dict) and isinstance(detail.get("error"), dict):  # already an OpenAI body
        e = detail["error"]
        return APIError(exc.status_code, str(e.get("message", "")), type=e.get("type"), param=e.get("param"),
                        code=e.get("code"))
    message = detail if isinstance(detail, str) else json.dumps(detail)
    if exc.status_code == 404 and message == "Not Found":
        message = "unknown URL; see /v1/models, /v1/chat/completions, /v1/completions, /v1/messages"
    return APIError(exc.status_code, message,
                    code="unknown_url" if exc.status_code == 404 and "unknown URL" in message else None)


def install_error_handlers(app: FastAPI) -> None:
    """Registers the handlers that turn every exception into the route's error body."""

    @app.exception_handler(APIError)
    async def _api(request: Request, exc: APIError) -> JSONResponse:
        return error_response(request, exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(request, _validation_error(exc))

    @app.exception_handler(InvalidRequestError)
    async def _engine_invalid(request: Request, exc: InvalidRequestError) -> JSONResponse:
        return error_response(request, from_engine_error(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error_response(request, _http_error(exc))

    @app.exception_handler(EngineStoppedError)
    @app.exception_handler(ModelStopped)  # the same, met through a ChatModel (the scene dialogue's LocalModel)
    async def _engine_stopped(request: Request, exc: Exception) -> JSONResponse:
        return error_response(request, engine_stopped_error())

    @app.exception_handler(EngineError)
    async def _engine(request: Request, exc: EngineError) -> JSONResponse:
        log.error("engine error on %s: %s", request.url.path, exc)
        return error_response(request, APIError(500, f"the engine could not serve this request: {exc}"))

    @app.exception_handler(OperationalError)
    async def _database(request: Request, exc: OperationalError) -> JSONResponse:
        if not is_busy_error(exc):
            return await _unexpected(request, exc)
        log.warning("database busy on %s %s: %s", request.method, request.url.path, exc.orig)
        return error_response(request, busy_error())

    @app.exception_handler(UnicodeEncodeError)
    async def _unicode(request: Request, exc: UnicodeEncodeError) -> JSONResponse:
        # Text that cannot be UTF-8 (a lone surrogate such as "\ud800") reached a codec below a route; the body
        # check (api/body_limit.py) refuses most of it first. Any other encoding failure is ours: a 500.
        if "surrogate" not in str(exc.reason):
            return await _unexpected(request, exc)
        log.info("undecodable text on %s %s: %s", request.method, request.url.path, exc)
        return error_response(request, APIError(400, "the request contains text that is not valid Unicode (a lone "
                                                     "surrogate such as \\ud800?); send UTF-8 text",
                                                code="invalid_unicode"))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        # The traceback goes to the server log only: it can reveal paths and internals.
        log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
        return error_response(request, APIError(500, "the server had an internal error while processing "
                                                     "your request; it has been logged"))


def busy_error() -> APIError:
    """503 + Retry-After: another process holds the database's write lock past the busy timeout."""
    return APIError(503, "the database is busy (another process holds its write lock); retry shortly",
                    code="database_busy", headers={"Retry-After": str(BUSY_RETRY_AFTER_S)})


def engine_stopped_error() -> APIError:
    """503: the engine stopped after failed steps (engine/async_engine.py); a restart brings it back."""
    return APIError(503, EngineStoppedError.MESSAGE, code="engine_stopped")

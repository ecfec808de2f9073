"""FastAPI's own errors (unknown route, bad query, a bug) answered in OpenAI's shape; and
the last resort, for whatever escapes the app before it answered (uvicorn's own 500 is
plain text)."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from transcription_api.errors import APIError, bad_request

log = logging.getLogger("transcription_frontend")


def respond(e: APIError) -> Response:
    return Response(e.body(), e.status, e.headers, media_type="application/json")


async def api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, APIError)
    return respond(exc)


async def http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 404:  # an unknown route: no model is involved
        return respond(APIError(404, str(exc.detail), code="unknown_url"))
    return respond(APIError(exc.status_code, str(exc.detail)))


async def validation_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
    loc = [str(x) for x in first.get("loc", ()) if x not in ("body", "query")]
    param = ".".join(loc) or None
    return respond(bad_request(f"{param}: {first['msg']}" if param else str(first["msg"]), param))


def internal_error(exc: Exception) -> APIError:
    """Last resort: a bug must still answer in OpenAI's shape (and is logged)."""
    log.error("unhandled error", exc_info=exc)
    return APIError(500, "internal error in the gateway", type="server_error")


async def unhandled_error(request: Request, exc: Exception) -> Response:
    return respond(internal_error(exc))


def install(app: FastAPI) -> None:
    app.add_exception_handler(APIError, api_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(Exception, unhandled_error)


class LastResort:
    """ASGI: an exception that escapes the app before its answer started, or an app that
    returns without answering, gets a 500 in OpenAI's shape (and is logged)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def sending(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except Exception as e:
            if started:
                raise
            error = internal_error(e)
        else:
            if started:
                return
            error = internal_error(RuntimeError("the app returned without answering"))
        error.headers["Connection"] = "close"
        headers = [(b"content-type", b"application/json")]
        headers += [(k.lower().encode(), v.encode()) for k, v in error.headers.items()]
        await send({"type": "http.response.start", "status": error.status, "headers": headers})
        await send({"type": "http.response.body", "body": error.body()})

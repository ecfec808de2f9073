"""FastAPI's own errors (unknown route, bad query, a bug) answered in OpenAI's shape."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

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

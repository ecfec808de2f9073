"""Errors as typed responses in OpenAI's shape: `{"error": {message, type, param, code}}`."""

from __future__ import annotations

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from transcription_api.openai import ErrorDetail, ErrorResponse

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    499: "client_closed_request",
    502: "server_error",
    503: "service_unavailable",
    504: "server_error",
}
_CODES = {
    401: "invalid_api_key",
    404: "model_not_found",
    413: "file_too_large",
    503: "no_ready_worker",
}


class APIError(Exception):
    """An error the client gets, with its HTTP status."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        type: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code or _CODES.get(status)
        self.type = type or _TYPES.get(
            status, "server_error" if status >= 500 else "invalid_request_error"
        )
        self.headers = headers or {}

    def response(self) -> JSONResponse:
        body = ErrorResponse(
            error=ErrorDetail(
                message=self.message, type=self.type, param=self.param, code=self.code
            )
        )
        return JSONResponse(body.model_dump(), status_code=self.status, headers=self.headers)


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code or "invalid_value")


def too_large(limit: int) -> APIError:
    mib = limit / (1024 * 1024)
    return APIError(
        413,
        f"File too large: the upload limit is {limit} bytes ({mib:.1f} MiB). "
        "Split the audio or compress it (e.g. to mp3 or opus).",
        param="file",
    )


def unavailable(message: str, retry_after: int = 5) -> APIError:
    return APIError(503, message, headers={"Retry-After": str(retry_after)})


async def api_error_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, APIError)
    return exc.response()


async def http_error_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    return APIError(exc.status_code, str(exc.detail)).response()


async def validation_error_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
    loc = [str(x) for x in first.get("loc", ()) if x not in ("body", "query")]
    param = ".".join(loc) or None
    return bad_request(f"{param}: {first['msg']}" if param else str(first["msg"]), param).response()


async def unhandled_error_handler(request: Request, exc: Exception) -> JSONResponse:
    """Last resort: a bug must still answer in OpenAI's shape (and is logged)."""
    import logging

    logging.getLogger("transcription_frontend").exception("unhandled error", exc_info=exc)
    return APIError(500, "internal error in the gateway", type="server_error").response()

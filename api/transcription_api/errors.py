"""Errors as OpenAI answers them: `{"error": {"message", "type", "param", "code"}}`.

One exception for every server that speaks the OpenAI audio API (the gateway and the CPU
worker): raise an `APIError` anywhere, answer with `status`, `headers` and `body()`.
Status codes follow OpenAI's where OpenAI has one; `type` and `code` default from the status.
"""

from __future__ import annotations

from .openai import ErrorDetail, ErrorEvent, ErrorResponse

TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    499: "client_closed_request",
    503: "service_unavailable",
}
CODES = {
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
        self.code = code or CODES.get(status)
        self.type = type or TYPES.get(
            status, "server_error" if status >= 500 else "invalid_request_error"
        )
        self.headers = headers or {}

    @property
    def detail(self) -> ErrorDetail:
        return ErrorDetail(message=self.message, type=self.type, param=self.param, code=self.code)

    def body(self) -> bytes:
        """The JSON body of the error response."""
        return ErrorResponse(error=self.detail).model_dump_json().encode()

    def event(self) -> ErrorEvent:
        """The same error as a stream event, once a stream's headers are sent."""
        return ErrorEvent(error=self.detail)


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code or "invalid_value")


def too_large(limit: int, what: str = "the upload limit") -> APIError:
    return APIError(
        413,
        f"File too large: {what} is {limit} bytes ({limit / 1024**2:.1f} MiB). "
        "Split the audio or compress it (e.g. to mp3 or opus).",
        param="file",
    )


def unavailable(message: str, retry_after: int = 5) -> APIError:
    return APIError(503, message, headers={"Retry-After": str(retry_after)})

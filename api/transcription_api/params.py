"""Request parameters: a form's fields -> one typed `TranscriptionRequest`, or a 400 whose
message says what is wrong and what is allowed.

Both servers that accept OpenAI audio requests (the gateway and the CPU worker) parse with
this function, so a client gets the same answer from either. Engine-specific checks (the
languages a model knows) stay with the engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from .errors import APIError, bad_request
from .fields import refusal
from .openai import ResponseFormat, TranscriptionRequest

GRANULARITIES = "timestamp_granularities[]"
STREAMABLE = (ResponseFormat.JSON, ResponseFormat.TEXT)
_SCALARS = ("model", "language", "prompt", "response_format", "temperature", "stream")


def field(fields: Sequence[tuple[str, str]], name: str) -> str | None:
    """The first value of a form field, or None."""
    return next((v for k, v in fields if k == name), None)


def flag(value: str | None) -> bool:
    """A form boolean as clients send it (`true`/`false`, `1`/`0`)."""
    return (value or "").strip().lower() in ("true", "1")


def parse_request(fields: Sequence[tuple[str, str]]) -> TranscriptionRequest:
    """The request's options, validated; raises APIError(400) naming the bad field, or a
    field of OpenAI's that no engine here can honour (fields.py)."""
    if error := refusal(fields):
        raise error
    raw: dict[str, Any] = {}
    for name in _SCALARS:
        value = field(fields, name)
        if value is not None:
            raw[name] = value
    # The SDKs send `timestamp_granularities[]`; accept the bare name too.
    grans = [v for k, v in fields if k in (GRANULARITIES, "timestamp_granularities")]
    if grans:
        raw[GRANULARITIES] = grans
    if "stream" in raw:
        value = raw["stream"].strip().lower()
        if value not in ("true", "false", "1", "0"):
            raise bad_request(f"stream must be true or false, got {raw['stream']!r}", "stream")
        raw["stream"] = value in ("true", "1")
    if raw.get("language") is not None:
        lang = raw["language"].strip().lower()
        if not (2 <= len(lang) <= 3 and lang.isalpha()):
            raise bad_request(
                f"language must be an ISO-639-1 code such as 'en' or 'de', got {raw['language']!r}",
                "language",
            )
        raw["language"] = lang
    try:
        request = TranscriptionRequest.model_validate(raw)
    except ValidationError as e:
        raise _message(e, raw) from e
    return _check_combination(request)


def _message(e: ValidationError, raw: dict[str, Any]) -> APIError:
    err = e.errors()[0]
    param = str(err["loc"][0]) if err["loc"] else None
    if param == "response_format":
        allowed = ", ".join(f.value for f in ResponseFormat)
        return bad_request(f"response_format must be one of {allowed}", param)
    if param == GRANULARITIES:
        return bad_request("timestamp_granularities[] values must be word or segment", param)
    if param == "temperature":
        return bad_request(
            f"temperature must be a number between 0 and 1, got {raw.get('temperature')!r}", param
        )
    return bad_request(f"{param}: {err['msg']}", param)


def _check_combination(r: TranscriptionRequest) -> TranscriptionRequest:
    fmt = r.response_format
    if r.stream and fmt not in STREAMABLE:
        raise bad_request(
            f"stream=true is supported with response_format json or text, not {fmt.value}",
            "stream",
        )
    if r.timestamp_granularities and fmt != ResponseFormat.VERBOSE_JSON:
        raise bad_request(
            "timestamp_granularities[] needs response_format=verbose_json", GRANULARITIES
        )
    return r

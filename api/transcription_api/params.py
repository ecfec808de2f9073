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

from .diarization import NAMES, REFERENCES, known_speakers
from .errors import APIError, bad_request
from .fields import refusal
from .openai import ResponseFormat, TranscriptionRequest

GRANULARITIES = "timestamp_granularities[]"
LANGUAGES = "languages[]"
KEYWORDS = "keywords[]"
INCLUDE = "include[]"
# Whisper reads at most 223 prompt tokens (half its 448-token context), the last ones kept:
# about 800 characters of English.
MAX_KEYWORD_CHARS = 800
STREAMABLE = (ResponseFormat.JSON, ResponseFormat.TEXT, ResponseFormat.DIARIZED_JSON)
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
        raw["language"] = _code(raw["language"], "language")
    languages = [_code(v, LANGUAGES) for k, v in fields if k in (LANGUAGES, "languages")]
    if languages:
        raw[LANGUAGES] = list(dict.fromkeys(languages))  # in order, each once
        if len(raw[LANGUAGES]) == 1:  # one language: the audio's language
            if raw.get("language") not in (None, languages[0]):
                raise bad_request(
                    f"language={raw['language']} and languages[]={languages[0]} disagree: "
                    "send one of them",
                    "language",
                )
            raw["language"] = languages[0]
        elif raw.get("language") is not None:
            raise bad_request(
                "send either language (the audio's language) or several languages[] (the "
                "languages it may be in), not both",
                "language",
            )
    include = [v.strip() for k, v in fields if k in (INCLUDE, "include")]
    if include:
        if unknown := sorted(set(include) - {"logprobs"}):
            raise bad_request(f"include[] takes logprobs, not {', '.join(unknown)}", INCLUDE)
        raw[INCLUDE] = list(dict.fromkeys(include))
    for name in (NAMES, REFERENCES):
        values = [v for k, v in fields if k in (name, name.removesuffix("[]"))]
        if values:
            raw[name] = values
    keywords = [v for k, v in fields if k in (KEYWORDS, "keywords")]
    if keywords:
        raw["prompt"] = keyword_prompt(raw.get("prompt"), keywords)
        raw[KEYWORDS] = keywords
    try:
        request = TranscriptionRequest.model_validate(raw)
    except ValidationError as e:
        raise _message(e, raw) from e
    return _check_combination(request)


def keyword_prompt(prompt: str | None, keywords: Sequence[str]) -> str:
    """The prompt that biases recognition towards `keywords`: the client's prompt, then the
    words, as Whisper reads a prompt (the transcript before the audio; faster-whisper's
    `hotwords` are the same tokens). 400 for an empty keyword or too many."""
    words = [" ".join(k.split()) for k in keywords]
    if not all(words):
        raise bad_request("keywords[] must not be empty or blank", KEYWORDS)
    listed = ", ".join(dict.fromkeys(words)) + "."
    if len(listed) > MAX_KEYWORD_CHARS:
        raise bad_request(
            f"keywords[] are {len(listed)} characters together; the model reads at most about "
            f"{MAX_KEYWORD_CHARS} (223 tokens): send fewer",
            KEYWORDS,
        )
    return f"{prompt.strip()} {listed}" if prompt and prompt.strip() else listed


def _code(value: str, param: str) -> str:
    code = value.strip().lower()
    if not (2 <= len(code) <= 3 and code.isalpha()):
        raise bad_request(
            f"{param} must be an ISO-639-1 code such as 'en' or 'de', got {value!r}", param
        )
    return code


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
    if r.logprobs and fmt != ResponseFormat.JSON:
        raise bad_request(
            f"include[]=logprobs needs response_format=json (as OpenAI's API), not {fmt.value}",
            INCLUDE,
        )
    if r.timestamp_granularities and fmt != ResponseFormat.VERBOSE_JSON:
        raise bad_request(
            "timestamp_granularities[] needs response_format=verbose_json", GRANULARITIES
        )
    if r.known_speaker_names or r.known_speaker_references:
        if not r.diarized:
            raise bad_request(
                f"known speakers label diarized segments: they need "
                f"response_format=diarized_json, not {fmt.value}",
                NAMES if r.known_speaker_names else REFERENCES,
            )
        known_speakers(r.known_speaker_names, r.known_speaker_references)
    return r

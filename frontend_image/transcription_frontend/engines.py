"""Per-engine requests: which pools' engines can take a request, and the request rewritten
for each.

vLLM renders no `srt`/`vtt` and answers `text` with JSON; `transformers serve` only ever
returns `{"text"}`. Such engines are asked for what they render (`verbose_json` for
segments, `json` otherwise) and the gateway renders the rest.

`model` becomes the name the pool's workers answer to: the pool's `worker_model` where the
engine has no aliases (`transformers serve` would try to download any other name from the
hub), else the primary model. Every other field the client sent reaches the engine as sent,
except where an engine refuses fields: `transformers serve` answers any field outside its
list (its profile's) with a 422. A pool whose engine cannot take a request -- such a field,
a container it cannot decode, audio longer than it transcribes -- is passed over for the
next pool that covers the request; when none is left, the client gets a 400 that says why.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Sequence
from typing import Any

from transcription_api.capabilities import Engine
from transcription_api.engines import StreamDialect
from transcription_api.errors import APIError, bad_request
from transcription_api.openai import (
    SEGMENT_FORMATS,
    ChunkUsage,
    ResponseFormat,
    TokenUsage,
    TranscriptionRequest,
)
from transcription_api.params import field
from transcription_api.routes import DEFAULT_TRANSCRIPTION_PROMPT, PoolRoute

from .sniff import AudioInfo

CHAT_PATH = "/v1/chat/completions"
# The longest transcript asked for through chat: Whisper's own cap for 30 s of audio.
TRANSCRIPT_MAX_TOKENS = 448


def engine_format(requested: ResponseFormat, native: frozenset[str]) -> ResponseFormat:
    """The format to ask the engine for, given what it renders itself."""
    if requested.value in native:
        return requested
    if requested in SEGMENT_FORMATS:
        return ResponseFormat.VERBOSE_JSON
    return ResponseFormat.JSON


def worker_model(pool: PoolRoute, primary: str) -> str:
    """The `model` a pool's workers answer to."""
    return pool.worker_model or primary


def engine_fields(
    fields: list[tuple[str, str]], pool: PoolRoute, primary: str, request: TranscriptionRequest
) -> list[tuple[str, str]]:
    """The client's fields for this pool's engine: every one kept, a few rewritten."""
    caps = pool.capability_set
    fmt = engine_format(request.response_format, caps.native_formats)
    strict = pool.serving.transcription_fields is not None  # it spells arrays without `[]`
    out: list[tuple[str, str]] = []
    for k, v in fields:
        if k == "model":
            v = worker_model(pool, primary)
        elif k == "response_format":
            v = fmt.value
        elif strict and k.endswith("[]"):
            k = k[:-2]
        out.append((k, v))
    if field(fields, "model") is None:
        out.append(("model", worker_model(pool, primary)))
    if field(fields, "response_format") is None and fmt != ResponseFormat.JSON:
        out.append(("response_format", fmt.value))
    chunked = pool.serving.stream_dialect == StreamDialect.OPENAI_CHUNK
    if request.stream and chunked and field(fields, "stream_include_usage") is None:
        out.append(("stream_include_usage", "true"))  # usage for transcript.text.done
    return out


# --------------------------------------------------------------------------- pool choice

Refusal = Callable[[PoolRoute], APIError | None]


def able(pools: list[PoolRoute], refusal: Refusal) -> list[PoolRoute]:
    """The pools whose engines can take the request, in order; the first pool's refusal
    (the one the client would have been served by) when none can."""
    kept: list[PoolRoute] = []
    first: APIError | None = None
    for pool in pools:
        error = refusal(pool)
        if error is None:
            kept.append(pool)
        elif first is None:
            first = error
    if not kept:
        assert first is not None
        raise first
    return kept


def _name(pool: PoolRoute) -> str:
    return f"the {pool.engine.value} engine of pool {pool.name}"


def unknown_fields(pool: PoolRoute, names: Sequence[str], accepted: frozenset[str]) -> APIError:
    listed = ", ".join(f"`{n}`" for n in names)
    return bad_request(
        f"{_name(pool)} does not accept the field(s) {listed}; remove them (it accepts: "
        f"{', '.join(sorted(accepted))})",
        param=names[0],
        code="unsupported_field",
    )


def audio_refusal(pool: PoolRoute, audio: AudioInfo, param: str = "file") -> APIError | None:
    """Why a pool's engine cannot take this audio: its container, or its length."""
    caps = pool.capability_set
    if caps.audio_formats is not None and audio.container not in caps.audio_formats:
        return bad_request(
            f"the audio is {audio.description}, which {_name(pool)} cannot decode (it reads "
            f"{', '.join(sorted(caps.audio_formats))}); convert it, e.g. "
            "`ffmpeg -i in.m4a out.flac`",
            param=param,
            code="unsupported_audio_format",
        )
    limit = caps.max_audio_seconds
    if limit is not None and audio.seconds is not None and audio.seconds > limit + 0.01:
        return bad_request(
            f"the audio is {audio.seconds:.1f} s long and {_name(pool)} transcribes at most "
            f"{limit:g} s (it would silently drop the rest): split the audio into pieces of "
            f"{limit:g} s or less",
            param=param,
            code="audio_too_long",
        )
    return None


def transcription_refusal(fields: list[tuple[str, str]], audio: AudioInfo) -> Refusal:
    def refusal(pool: PoolRoute) -> APIError | None:
        accepted = pool.serving.transcription_fields
        if accepted is not None:
            names = {k.removesuffix("[]") for k, _ in fields} - accepted
            if names:
                return unknown_fields(pool, sorted(names), accepted)
        return audio_refusal(pool, audio)

    return refusal


# --------------------------------------------------------------------------- chat


def chat_refusal(body: dict[str, Any], audio: list[tuple[str, AudioInfo]]) -> Refusal:
    def refusal(pool: PoolRoute) -> APIError | None:
        accepted = pool.profile.chat_fields
        if accepted is not None and (names := sorted(set(body) - accepted)):
            return unknown_fields(pool, names, accepted)
        if pool.engine == Engine.TRANSFORMERS and (error := _transformers_ignores(pool, body)):
            return error
        for param, info in audio:
            if error := audio_refusal(pool, info, param):
                return error
        return None

    return refusal


def _transformers_ignores(pool: PoolRoute, body: dict[str, Any]) -> APIError | None:
    """Fields `transformers serve` takes and ignores, refused where ignoring them would change
    the answer the client asked for."""
    fmt = body.get("response_format")
    problems = [
        ("n", body.get("n") not in (None, 1), "it returns one choice: n must be 1"),
        ("logprobs", bool(body.get("logprobs")) or bool(body.get("top_logprobs")),
         "it returns no log probabilities"),
        ("response_format", isinstance(fmt, dict) and fmt.get("type") not in (None, "text"),
         "it answers free text: no JSON mode or schema"),
        ("modalities", "audio" in (body.get("modalities") or []) or bool(body.get("audio")),
         "it answers text only, no audio"),
    ]  # fmt: skip
    for param, refused, why in problems:
        if refused:
            return bad_request(f"{_name(pool)} cannot honour `{param}`: {why}", param=param,
                               code="unsupported_field")  # fmt: skip
    return None


def chat_body(body: dict[str, Any], pool: PoolRoute, primary: str) -> bytes:
    """The client's JSON body for this pool's engine: `model` rewritten, nothing else."""
    return json.dumps(
        {**body, "model": worker_model(pool, primary)}, ensure_ascii=False, separators=(",", ":")
    ).encode()


# ------------------------------------------------------------- transcription through chat


def transcription_instruction(pool: PoolRoute, request: TranscriptionRequest) -> str:
    """What an audio language model is asked with the audio: the pool's instruction, plus
    the request's language and prompt."""
    text = pool.transcription_prompt or DEFAULT_TRANSCRIPTION_PROMPT
    if request.language:
        text += f" The speech is in the language with ISO-639-1 code '{request.language}'."
    if request.prompt:
        text += f" Earlier speech, or words and spellings it uses: {request.prompt}"
    return text


def chat_transcription(
    audio: bytes, container: str, pool: PoolRoute, primary: str, request: TranscriptionRequest
) -> bytes:
    """A transcription request as a chat completion request for an audio language model:
    one user message holding the audio (an `input_audio` part) and the instruction."""
    content = [
        {"type": "input_audio",
         "input_audio": {"data": base64.b64encode(audio).decode(), "format": container}},
        {"type": "text", "text": transcription_instruction(pool, request)},
    ]  # fmt: skip
    body: dict[str, Any] = {
        "model": worker_model(pool, primary),
        "messages": [{"role": "user", "content": content}],
        "max_tokens": TRANSCRIPT_MAX_TOKENS,
        "temperature": request.temperature,
    }
    if request.stream:
        body["stream"] = True
    return json.dumps(body, separators=(",", ":")).encode()


def transcript_of_chat(doc: Any) -> dict[str, Any]:
    """A chat completion's answer as OpenAI's transcription JSON (`text`, `usage`); raises
    ValueError when it is not a chat completion."""
    try:
        text = doc["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        raise ValueError("no choices[0].message.content in its chat completion") from None
    if not isinstance(text, str):
        raise ValueError("its chat completion's content is not text")
    out: dict[str, Any] = {"text": text.strip()}
    if usage := doc.get("usage"):
        u = ChunkUsage.model_validate(usage)
        out["usage"] = TokenUsage(input_tokens=u.prompt_tokens, output_tokens=u.completion_tokens,
                                  total_tokens=u.total_tokens).model_dump()  # fmt: skip
    return out

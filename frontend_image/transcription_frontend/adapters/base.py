"""The adapter an engine that speaks OpenAI's API needs: the request the gateway sends it,
and how its answers and errors are read.

`model` becomes the name the pool's workers answer to: the pool's `worker_model` where the
engine has no aliases (`transformers serve` would try to download any other name from the
hub), else the primary model. An engine that renders no `srt`/`vtt`, or answers `text` with
JSON (vLLM), is asked for what it renders (`verbose_json` for segments, `json` otherwise)
and the gateway renders the rest. Every other field the client sent reaches the engine as
sent, except where its profile lists the fields it accepts: a field outside the list gets a
400 here, before the engine would answer it with an error of its own. A pool whose engine
cannot take a request -- such a field, a container it cannot decode, audio longer than it
transcribes -- is passed over for the next pool that covers the request (`able`); when none
is left, the client gets a 400 that says why.

Streams and errors are read in the dialects the engine's profile names (`streams.py`,
`respond.py`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from pydantic import ValidationError

from transcription_api import params, sse
from transcription_api.capabilities import Capability
from transcription_api.engines import StreamDialect
from transcription_api.errors import APIError, bad_request
from transcription_api.multipart import Upload
from transcription_api.openai import SEGMENT_FORMATS, ResponseFormat, TranscriptionRequest
from transcription_api.params import field
from transcription_api.render import PLAIN, billed_seconds, render
from transcription_api.routes import PoolRoute

from ..forward import Body, JsonBody, MultipartBody, WorkerAnswer
from ..inline import dumps
from ..respond import Reply, worker_error
from ..sniff import AudioInfo
from ..streams import ChatStream, Translation, worker_failed

CHAT_PATH = "/v1/chat/completions"
JSON_FORMATS = (ResponseFormat.JSON, ResponseFormat.VERBOSE_JSON)
# The SDK's names of the array fields the gateway rewrites, and the bare ones.
LANGUAGES = (params.LANGUAGES, params.LANGUAGES.removesuffix("[]"))
KEYWORDS = (params.KEYWORDS, params.KEYWORDS.removesuffix("[]"))


class Adapter:
    """How the gateway speaks with one pool's engine, both ways. This base speaks OpenAI's
    API as vLLM's server and our worker do; an engine's adapter overrides what its engine
    does otherwise."""

    # The engine cannot detect the language of an English-only model (vLLM raises a 500):
    # the frontend names English for it when the client named no language.
    names_english = False
    # The model is billed by the audio's duration (Whisper), so answers carry the seconds as
    # their usage; False keeps the engine's token usage (an audio language model, as
    # OpenAI's gpt-4o-transcribe answers). The metrics count the seconds either way.
    billed_by_duration = True

    def __init__(self, pool: PoolRoute) -> None:
        self.pool = pool
        self.profile = pool.profile
        self.serving = pool.serving
        self.caps = pool.capability_set

    @property
    def name(self) -> str:
        """How error messages name the engine."""
        return f"the {self.pool.engine.value} engine of pool {self.pool.name}"

    def worker_model(self, primary: str) -> str:
        """The `model` the pool's workers answer to."""
        return self.pool.worker_model or primary

    async def error(self, answer: WorkerAnswer) -> APIError:
        """The client's error for the engine's non-200 answer."""
        return await worker_error(answer, self.profile.error_dialect)

    # ------------------------------------------------------------------ transcriptions

    def transcription_refusal(
        self, fields: list[tuple[str, str]], audio: AudioInfo
    ) -> APIError | None:
        """Why the engine cannot take this transcription request, or None."""
        accepted = self.serving.transcription_fields
        if accepted is not None:
            names = {k.removesuffix("[]") for k, _ in self.engine_fields(fields)} - accepted
            if names:
                return self.unknown_fields(sorted(names), accepted)
        languages = [v for k, v in fields if k in ("language", *LANGUAGES)]
        other = next((v for v in languages if v.strip().lower() != "en"), None)
        if self.pool.english_only and other:
            param = "language" if field(fields, "language") else LANGUAGES[0]
            return APIError(
                400,
                f"The model is English-only (a Whisper `.en` checkpoint): `{param}` must be "
                f"`en` or left out, not `{other}`. Deploy a multilingual model for other "
                "languages.",
                param=param,
            )
        return self.audio_refusal(audio)

    def engine_fields(self, fields: list[tuple[str, str]]) -> list[tuple[str, str]]:
        """The client's fields the engine gets as they are: `languages[]` with one language
        becomes `language` (every engine takes that), with several it goes to the engine
        (a pool with restricted language detection); `keywords[]` become the prompt."""
        named = [v for k, v in fields if k in LANGUAGES]
        dropped = KEYWORDS if len({v.strip().lower() for v in named}) > 1 else KEYWORDS + LANGUAGES
        return [(k, v) for k, v in fields if k not in dropped]

    def transcription_request(
        self, endpoint: Capability, upload: Upload, audio: AudioInfo, primary: str,
        request: TranscriptionRequest,
    ) -> tuple[str, Body]:  # fmt: skip
        """The path and body of the request to the engine (for each attempt)."""
        fields = self.transcription_fields(upload.fields, primary, request)
        return f"/v1/audio/{endpoint.value}", MultipartBody(fields, upload)

    def transcription_fields(
        self, fields: list[tuple[str, str]], primary: str, request: TranscriptionRequest
    ) -> list[tuple[str, str]]:
        """The client's fields for the engine: every one kept, a few rewritten."""
        fmt = self.engine_format(request.response_format)
        out: list[tuple[str, str]] = []
        for k, v in self.engine_fields(fields):
            if k == "model":
                v = self.worker_model(primary)
            elif k == "response_format":
                v = fmt.value
            elif k == "prompt" and request.prompt:
                v = request.prompt  # with the keywords
            out.append((self.field_name(k), v))
        if field(fields, "model") is None:
            out.append(("model", self.worker_model(primary)))
        if field(fields, "response_format") is None and fmt != ResponseFormat.JSON:
            out.append(("response_format", fmt.value))
        if field(out, "prompt") is None and request.prompt:
            out.append(("prompt", request.prompt))  # the keywords
        if field(out, "language") is None and len(request.languages) == 1:
            out.append(("language", request.languages[0]))
        if self.pool.english_only and self.names_english and field(out, "language") is None:
            out.append(("language", "en"))
        chunked = self.serving.stream_dialect == StreamDialect.OPENAI_CHUNK
        if request.stream and chunked and field(fields, "stream_include_usage") is None:
            out.append(("stream_include_usage", "true"))  # usage for transcript.text.done
        return out

    def field_name(self, name: str) -> str:
        """A form field's name as the engine spells it."""
        return name

    def engine_format(self, requested: ResponseFormat) -> ResponseFormat:
        """The format to ask the engine for, given what it renders itself."""
        if requested.value in self.caps.native_formats:
            return requested
        if requested in SEGMENT_FORMATS:
            return ResponseFormat.VERBOSE_JSON
        return ResponseFormat.JSON

    async def transcription_reply(
        self, answer: WorkerAnswer, request: TranscriptionRequest, audio: AudioInfo
    ) -> Reply:
        """The client's reply to the engine's answer (raises APIError for a failed one).
        Where the model is billed by duration, json and verbose_json carry the audio's
        seconds as their usage (`billed_seconds`), and so does a stream's done event where
        the upload's header gives its length."""
        if answer.status != 200:
            raise await self.error(answer)
        if request.stream:
            seconds = billed_seconds({}, audio.seconds)
            usage = seconds if self.billed_by_duration else None
            known = request.languages[:1] if len(request.languages) == 1 else []
            events = Translation(
                answer.chunks(), self.pool, self.serving.stream_dialect, usage, known
            )
            return Reply(200, sse.MEDIA_TYPE, stream=events, headers=sse.HEADERS, seconds=seconds)
        raw = await answer.read()
        fmt = request.response_format
        if fmt.value in self.caps.native_formats and fmt not in JSON_FORMATS:
            # The engine rendered it itself (text, subtitles): pass it through untouched.
            seconds = billed_seconds({}, audio.seconds)
            return Reply(200, answer.content_type or PLAIN, raw, seconds=seconds)
        body: Any
        if "json" in answer.content_type:
            try:
                body = self.transcript(json.loads(raw))
            except ValueError as e:
                raise worker_failed(self.pool, f"it sent an unexpected answer: {e}") from e
            if not isinstance(body, dict):
                raise worker_failed(self.pool, "it sent an unexpected answer: no JSON object")
        else:
            body = {"text": raw.decode("utf-8", "replace")}
        seconds = billed_seconds(body, audio.seconds)
        if request.languages and not body.get("languages"):
            code = request.language or body.get("language")  # one given, or the detected one
            body = {**body, "languages": [{"code": code}] if code else []}
        try:
            out = render(fmt, body, seconds if self.billed_by_duration else None)
        except ValidationError as e:
            raise worker_failed(self.pool, f"it sent an unexpected answer: {e}") from e
        return Reply(200, out.content_type, out.body, seconds=seconds)

    def transcript(self, doc: Any) -> Any:
        """The engine's JSON answer as OpenAI's transcription JSON; raises ValueError when it
        is none."""
        return doc

    # ------------------------------------------------------------------ chat

    def chat_refusal(
        self, body: dict[str, Any], audio: list[tuple[str, AudioInfo]]
    ) -> APIError | None:
        """Why the engine cannot take this chat request, or None."""
        accepted = self.profile.chat_fields
        if accepted is not None and (names := sorted(set(body) - accepted)):
            return self.unknown_fields(names, accepted)
        if error := self.ignored_chat_fields(body):
            return error
        for param, info in audio:
            if error := self.audio_refusal(info, param):
                return error
        return None

    def ignored_chat_fields(self, body: dict[str, Any]) -> APIError | None:
        """Fields the engine takes and ignores, refused where ignoring them would change the
        answer the client asked for."""
        return None

    def chat_request(self, body: dict[str, Any], primary: str) -> tuple[str, JsonBody]:
        """The client's JSON body for the engine: `model` rewritten, nothing else."""
        return CHAT_PATH, JsonBody({**body, "model": self.worker_model(primary)})

    async def chat_reply(self, answer: WorkerAnswer, primary: str, stream: bool) -> Reply:
        """The client's reply to the engine's answer (raises APIError for a failed one)."""
        if answer.status != 200:
            raise await self.error(answer)
        if stream:
            events = ChatStream(answer.chunks(), self.pool, primary)
            return Reply(200, sse.MEDIA_TYPE, stream=events, headers=sse.HEADERS)
        raw = await answer.read()
        try:
            doc = json.loads(raw)
        except ValueError:
            doc = None
        if not isinstance(doc, dict):
            raise worker_failed(self.pool, "it sent no JSON object")
        if (err := sse.error_in(doc)) is not None:
            raise worker_failed(self.pool, err.message)
        doc["model"] = primary
        return Reply(200, "application/json", dumps(doc))

    # ------------------------------------------------------------------ refusals

    def unknown_fields(self, names: Sequence[str], accepted: frozenset[str]) -> APIError:
        listed = ", ".join(f"`{n}`" for n in names)
        return bad_request(
            f"{self.name} does not accept the field(s) {listed}; remove them (it accepts: "
            f"{', '.join(sorted(accepted))})",
            param=names[0],
            code="unsupported_field",
        )

    def audio_refusal(self, audio: AudioInfo, param: str = "file") -> APIError | None:
        """Why the engine cannot take this audio: its container, or its length."""
        caps = self.caps
        if caps.audio_formats is not None and audio.container not in caps.audio_formats:
            return bad_request(
                f"the audio is {audio.description}, which {self.name} cannot decode (it "
                f"reads {', '.join(sorted(caps.audio_formats))}); convert it, e.g. "
                "`ffmpeg -i in.m4a out.flac`",
                param=param,
                code="unsupported_audio_format",
            )
        limit = caps.max_audio_seconds
        if limit is not None and audio.seconds is not None and audio.seconds > limit + 0.01:
            return bad_request(
                f"the audio is {audio.seconds:.1f} s long and {self.name} transcribes at most "
                f"{limit:g} s (it would silently drop the rest): split the audio into pieces "
                f"of {limit:g} s or less",
                param=param,
                code="audio_too_long",
            )
        return None


# --------------------------------------------------------------------------- pool choice

Refusal = Callable[[Adapter], APIError | None]


def able(adapters: list[Adapter], refusal: Refusal) -> list[Adapter]:
    """The adapters of the pools whose engines can take the request, in order; the first
    pool's refusal (the one the client would have been served by) when none can."""
    kept: list[Adapter] = []
    first: APIError | None = None
    for adapter in adapters:
        error = refusal(adapter)
        if error is None:
            kept.append(adapter)
        elif first is None:
            first = error
    if not kept:
        assert first is not None
        raise first
    return kept

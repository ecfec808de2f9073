"""The OpenAI-compatible gateway: endpoints, validation, routing, rendering."""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from transcription_api.capabilities import Capability
from transcription_api.openai import (
    Granularity,
    ModelCard,
    ModelList,
    ResponseFormat,
    TranscriptionParams,
)
from transcription_api.routes import PoolRoute

from . import metrics
from .discovery import EndpointSliceWatcher, TableWatcher
from .errors import (
    APIError,
    api_error_handler,
    bad_request,
    http_error_handler,
    too_large,
    unavailable,
    unhandled_error_handler,
    validation_error_handler,
)
from .formats import engine_format, render, translate_stream
from .proxy import Forwarder, WorkerAnswer, new_session, worker_error
from .routing import NoPool, Router
from .upload import Upload, parse_upload

log = logging.getLogger("transcription_frontend")

# Room for the multipart framing and form fields around the file, when comparing a
# request's Content-Length with the file size limit.
FORM_OVERHEAD = 256 * 1024

# Leading bytes of the containers Whisper engines decode (and a few more ffmpeg reads).
AUDIO_MAGIC: tuple[tuple[int, bytes], ...] = (
    (0, b"RIFF"),
    (0, b"RF64"),
    (0, b"fLaC"),
    (0, b"OggS"),
    (0, b"ID3"),
    (0, b"\x1a\x45\xdf\xa3"),
    (4, b"ftyp"),
    (0, b"#!AMR"),
    (0, b"FORM"),
    (0, b".snd"),
    (0, b"caff"),
    (0, b"\x30\x26\xb2\x75"),
)


def looks_like_audio(head: bytes) -> bool:
    if any(head[off : off + len(magic)] == magic for off, magic in AUDIO_MAGIC):
        return True
    # MPEG audio (mp3, aac/adts) frames start with 11 set bits.
    return len(head) >= 2 and head[0] == 0xFF and (head[1] & 0xE0) == 0xE0


@dataclass
class Gateway:
    router: Router
    api_keys_path: Path | None = None
    table_path: Path | None = None  # re-read when it changes
    slice_namespace: str | None = None  # watch this namespace's EndpointSlices
    kubeconfig: str | None = None
    started: int = field(default_factory=lambda: int(time.time()))
    client: aiohttp.ClientSession | None = None
    _keys: tuple[float, frozenset[str]] = (0.0, frozenset())

    def api_keys(self) -> frozenset[str]:
        """Accepted keys (one per line), re-read when the Secret file changes."""
        if self.api_keys_path is None:
            return frozenset()
        try:
            mtime = self.api_keys_path.stat().st_mtime
        except OSError:
            return self._keys[1]
        if mtime != self._keys[0]:
            keys = {k.strip() for k in self.api_keys_path.read_text().splitlines() if k.strip()}
            self._keys = (mtime, frozenset(keys))
        return self._keys[1]

    @property
    def forwarder(self) -> Forwarder:
        assert self.client is not None
        return Forwarder(self.router, self.client)


class RequestIdMiddleware:
    """Accepts or generates `x-request-id`, returns it, and logs one line per request."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = ""
        for k, v in scope["headers"]:
            if k == b"x-request-id":
                rid = v.decode("latin-1")[:128]
        rid = rid or uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = rid
        start = time.perf_counter()
        status = 0

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", []), (b"x-request-id", rid.encode())]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            if scope["path"] not in ("/health", "/ready", "/metrics"):
                log.info(
                    "%s %s %s %.1fms request_id=%s",
                    scope["method"],
                    scope["path"],
                    status,
                    (time.perf_counter() - start) * 1000,
                    rid,
                )


def request_id(request: Request) -> str:
    return str(request.scope.get("state", {}).get("request_id", ""))


# --------------------------------------------------------------------------- validation


def parse_params(upload: Upload) -> TranscriptionParams:
    raw: dict[str, Any] = {}
    for name in ("model", "language", "prompt", "response_format", "temperature", "stream"):
        value = upload.get(name)
        if value is not None:
            raw[name] = value
    grans = upload.get_all("timestamp_granularities[]") + upload.get_all("timestamp_granularities")
    if grans:
        raw["timestamp_granularities"] = grans
    if "stream" in raw:
        flag = raw["stream"].strip().lower()
        if flag not in ("true", "false", "1", "0"):
            raise bad_request(
                f"stream must be true or false, got {raw['stream']!r}", param="stream"
            )
        raw["stream"] = flag in ("true", "1")
    if raw.get("language") is not None:
        lang = raw["language"].strip().lower()
        if not (2 <= len(lang) <= 3 and lang.isalpha()):
            raise bad_request(
                f"language must be an ISO-639-1 code such as 'en' or 'de', got {raw['language']!r}",
                param="language",
            )
        raw["language"] = lang
    try:
        return TranscriptionParams.model_validate(raw)
    except ValidationError as e:
        err = e.errors()[0]
        param = str(err["loc"][0]) if err["loc"] else None
        if param == "response_format":
            allowed = ", ".join(f.value for f in ResponseFormat)
            raise bad_request(f"response_format must be one of {allowed}", param=param) from e
        if param == "timestamp_granularities":
            raise bad_request(
                "timestamp_granularities[] values must be word or segment",
                param="timestamp_granularities[]",
            ) from e
        if param == "temperature":
            raise bad_request(
                f"temperature must be a number between 0 and 1, got {raw.get('temperature')!r}",
                param=param,
            ) from e
        raise bad_request(f"{param}: {err['msg']}", param=param) from e


def needs_for(endpoint: str, params: TranscriptionParams) -> frozenset[Capability]:
    needs = {Capability(endpoint)}
    fmt = params.response_format
    if params.stream:
        if fmt not in (ResponseFormat.JSON, ResponseFormat.TEXT):
            raise bad_request(
                f"stream=true is supported with response_format json or text, not {fmt.value}",
                param="stream",
            )
        needs.add(Capability.STREAM)
    if fmt in (ResponseFormat.SRT, ResponseFormat.VTT, ResponseFormat.VERBOSE_JSON):
        needs.add(Capability.SEGMENT_TIMESTAMPS)
    if params.timestamp_granularities and fmt != ResponseFormat.VERBOSE_JSON:
        raise bad_request(
            "timestamp_granularities[] needs response_format=verbose_json",
            param="timestamp_granularities[]",
        )
    if Granularity.WORD in params.timestamp_granularities:
        needs.add(Capability.WORD_TIMESTAMPS)
    return frozenset(needs)


def engine_fields(
    upload: Upload, pool: PoolRoute, primary: str, params: TranscriptionParams
) -> list[tuple[str, str]]:
    """The client's fields for this pool's engine: every one kept, a few rewritten."""
    fmt = engine_format(params.response_format, pool.capability_set.native_formats)
    out: list[tuple[str, str]] = []
    for k, v in upload.fields:
        if k == "model":
            v = primary
        elif k == "response_format":
            v = fmt.value
        out.append((k, v))
    if upload.get("model") is None:
        out.append(("model", primary))
    if upload.get("response_format") is None and fmt != ResponseFormat.JSON:
        out.append(("response_format", fmt.value))
    chunked = pool.capability_set.stream_dialect == "openai-chunk"
    if params.stream and chunked and upload.get("stream_include_usage") is None:
        out.append(("stream_include_usage", "true"))  # usage for transcript.text.done
    return out


# --------------------------------------------------------------------------- handlers


async def until_disconnected(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def cancel_on_disconnect(request: Request, work: Awaitable[Response]) -> Response:
    """Await `work` here, cancelling it (and so the worker request) if the client goes away.

    One watcher task per request, which cancels this one on a disconnect.
    """
    current = asyncio.current_task()
    assert current is not None
    gone = False

    def on_disconnect(watcher: asyncio.Task[None]) -> None:
        nonlocal gone
        if not watcher.cancelled():
            gone = True
            current.cancel()

    watcher = asyncio.create_task(until_disconnected(request))
    watcher.add_done_callback(on_disconnect)
    try:
        return await work
    except asyncio.CancelledError:
        if gone:
            raise APIError(499, "client closed the request") from None
        raise
    finally:
        watcher.remove_done_callback(on_disconnect)
        watcher.cancel()


async def transcribe(request: Request, endpoint: str) -> Response:
    gw: Gateway = request.app.state.gateway
    table = gw.router.table
    started = time.perf_counter()
    model_label, pool_label, status, streaming = "unknown", "none", 500, False
    try:
        authorize(request, gw)
        limit = table.max_upload_bytes
        length = request.headers.get("content-length")
        if length and length.isdigit() and int(length) > limit + FORM_OVERHEAD:
            raise too_large(limit)
        upload = await parse_upload(request.stream(), request.headers.get("content-type"), limit)
        metrics.UPLOAD_BYTES.labels(endpoint=endpoint).observe(upload.size)
        try:
            params = parse_params(upload)
            primary = table.resolve(params.model)
            if primary is None:
                raise APIError(
                    404,
                    f"The model `{params.model}` does not exist. Valid models: "
                    + ", ".join(table.served_names),
                    param="model",
                )
            model_label = primary
            if upload.size == 0:
                raise bad_request("the uploaded file is empty", param="file", code="empty_file")
            assert upload.file is not None
            head = upload.file.read(16)
            upload.file.seek(0)
            if not looks_like_audio(head):
                raise bad_request(
                    "the file is not a recognised audio or video container (wav, mp3, flac, "
                    "ogg, webm, m4a, mp4 ...)",
                    param="file",
                    code="invalid_audio",
                )
            pools = gw.router.candidates(needs_for(endpoint, params), upload.size)
            if isinstance(pools, NoPool):
                if pools.too_large_for:
                    raise APIError(
                        413,
                        f"File too large for the pools that can serve this request "
                        f"({', '.join(pools.too_large_for)}): their engine's upload limit is "
                        "25 MiB. Split or compress the audio.",
                        param="file",
                    )
                raise bad_request(
                    "no pool of this deployment can serve this request: missing capability "
                    + ", ".join(sorted(pools.missing)),
                    code="unsupported_capability",
                )
            fields_for = {p.name: engine_fields(upload, p, primary, params) for p in pools}

            async def forward() -> Response:
                nonlocal pool_label, streaming
                path = f"/v1/audio/{endpoint}"
                answer = await gw.forwarder.send(
                    pools, path, fields_for, upload, request_id(request)
                )
                pool_label = answer.pool.name
                if params.stream and answer.status == 200:
                    streaming = True  # observed when the stream ends
                    return stream_response(gw, answer, model_label, endpoint, started)
                return await finish(gw, answer, params)

            response = await cancel_on_disconnect(request, forward())
        finally:
            upload.close()
        status = response.status_code
        return response
    except APIError as e:
        status = e.status
        return e.response()
    finally:
        if not streaming:
            _observe(model_label, endpoint, status, pool_label, started)


def _observe(model: str, endpoint: str, status: int, pool: str, started: float) -> None:
    metrics.request_done(model, endpoint, status, pool, time.perf_counter() - started)


async def finish(gw: Gateway, answer: WorkerAnswer, params: TranscriptionParams) -> Response:
    try:
        if answer.status != 200:
            raise await worker_error(answer)
        raw = await answer.read()
    finally:
        answer.close()
        gw.forwarder.release(answer)
    ctype = answer.content_type
    fmt = params.response_format
    native = answer.pool.capability_set.native_formats
    if fmt.value in native and fmt != ResponseFormat.VERBOSE_JSON:
        # The engine rendered it itself (json is OpenAI's {"text", "usage"} in every engine
        # that renders it): pass it through untouched.
        return Response(raw, media_type=ctype or "text/plain; charset=utf-8")
    body: Any
    if "json" in ctype:
        try:
            body = json.loads(raw)
        except ValueError as e:
            raise APIError(
                502, f"worker of pool {answer.pool.name} sent invalid JSON", type="server_error"
            ) from e
    else:
        body = {"text": raw.decode("utf-8", "replace")}
    try:
        content, media = render(params.response_format, body)
    except ValidationError as e:
        raise APIError(
            502,
            f"worker of pool {answer.pool.name} sent an unexpected answer: {e}",
            type="server_error",
        ) from e
    if media == "json":
        return JSONResponse(content)
    return PlainTextResponse(str(content), media_type=media)


def stream_response(
    gw: Gateway, answer: WorkerAnswer, model: str, endpoint: str, started: float
) -> StreamingResponse:
    dialect = answer.pool.capability_set.stream_dialect

    async def events() -> AsyncIterator[bytes]:
        try:
            async for event in translate_stream(answer.chunks(), dialect):
                yield event
        finally:
            answer.close()
            gw.forwarder.release(answer)
            _observe(model, endpoint, 200, answer.pool.name, started)

    headers = {"cache-control": "no-cache", "x-accel-buffering": "no"}
    return StreamingResponse(events(), media_type="text/event-stream", headers=headers)


def authorize(request: Request, gw: Gateway) -> None:
    keys = gw.api_keys()
    if not keys:
        return
    auth = request.headers.get("authorization", "")
    scheme, _, token = auth.partition(" ")
    if scheme.lower() != "bearer" or not token:
        raise APIError(401, "Missing API key: send `Authorization: Bearer <key>`.")
    if not any(hmac.compare_digest(token.strip(), k) for k in keys):
        raise APIError(401, "Incorrect API key provided.")


# --------------------------------------------------------------------------- app

_FORM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["file"],
    "properties": {
        "file": {"type": "string", "format": "binary", "description": "The audio file."},
        "model": {"type": "string", "description": "Model name or alias."},
        "language": {"type": "string", "description": "ISO-639-1 language of the audio."},
        "prompt": {"type": "string", "description": "Text to guide the model's style."},
        "response_format": {"type": "string", "enum": [f.value for f in ResponseFormat]},
        "temperature": {"type": "number", "minimum": 0, "maximum": 1},
        "timestamp_granularities[]": {
            "type": "array",
            "items": {"type": "string", "enum": ["word", "segment"]},
        },
        "stream": {"type": "boolean"},
    },
}


def _openapi_extra(summary: str) -> dict[str, Any]:
    return {
        "summary": summary,
        "requestBody": {
            "required": True,
            "content": {"multipart/form-data": {"schema": _FORM_SCHEMA}},
        },
        "responses": {
            "200": {"description": "The transcript, in the requested format."},
            "400": {"description": "Bad input."},
            "401": {"description": "Missing or wrong API key."},
            "404": {"description": "Unknown model."},
            "413": {"description": "Upload over the limit."},
            "503": {"description": "No ready worker."},
        },
    }


def create_app(gateway: Gateway) -> ASGIApp:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        tasks = []
        if gateway.table_path:
            tasks.append(
                asyncio.create_task(TableWatcher(gateway.table_path, gateway.router).run())
            )
        slices = None
        if gateway.slice_namespace:
            slices = EndpointSliceWatcher(
                gateway.router, gateway.slice_namespace, gateway.kubeconfig
            )
            slices.start()
        async with new_session() as client:
            gateway.client = client
            try:
                yield
            finally:
                for t in tasks:
                    t.cancel()
                if slices:
                    slices.stop()

    app = FastAPI(
        title="transcription gateway",
        version="0.1.0",
        description="OpenAI-compatible speech-to-text API in front of the worker pools.",
        lifespan=lifespan,
    )
    app.state.gateway = gateway
    app.add_exception_handler(APIError, api_error_handler)
    app.add_exception_handler(StarletteHTTPException, http_error_handler)
    app.add_exception_handler(RequestValidationError, validation_error_handler)
    app.add_exception_handler(Exception, unhandled_error_handler)
    _document_audio_routes(app)

    @app.get("/v1/models")
    async def models(request: Request) -> ModelList:
        authorize(request, gateway)
        table = gateway.router.table
        cards = [
            ModelCard(
                id=n,
                created=gateway.started,
                owned_by="transcription-operator",
                root=table.model,
                parent=None if n == table.model else table.model,
            )
            for n in table.served_names
        ]
        return ModelList(data=cards)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/ready")
    async def ready() -> JSONResponse:
        if gateway.router.any_ready():
            return JSONResponse({"status": "ready"})
        raise unavailable("no pool has a ready worker yet")

    @app.get("/metrics")
    async def metrics_endpoint() -> Response:
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    return RequestIdMiddleware(AudioRoutes(app))


AUDIO_PATHS = {
    "/v1/audio/transcriptions": "transcriptions",
    "/v1/audio/translations": "translations",
}


class AudioRoutes:
    """The two upload endpoints, served ahead of FastAPI's stack; everything else is FastAPI.

    They parse their own bodies and answer every error themselves, so FastAPI's routing,
    dependency, exception and body-limit layers add nothing for them -- except about
    0.4 ms of CPU per request, a fifth of the gateway's whole budget.
    """

    def __init__(self, app: FastAPI) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        endpoint = AUDIO_PATHS.get(scope.get("path", "")) if scope["type"] == "http" else None
        if endpoint is None:
            await self.app(scope, receive, send)
            return
        scope["app"] = self.app
        request = Request(scope, receive, send)
        response: Response
        if scope["method"] != "POST":
            response = APIError(405, f"{scope['method']} is not allowed; use POST").response()
        else:
            try:
                response = await transcribe(request, endpoint)
            except Exception as e:
                response = await unhandled_error_handler(request, e)
        await response(scope, receive, send)


def _document_audio_routes(app: FastAPI) -> None:
    """Add the audio endpoints (served by AudioRoutes) to the OpenAPI document."""
    base = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = base()
            for path, summary in (
                ("/v1/audio/transcriptions", "Transcribe audio"),
                ("/v1/audio/translations", "Translate audio to English"),
            ):
                schema.setdefault("paths", {})[path] = {"post": _openapi_extra(summary)}
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

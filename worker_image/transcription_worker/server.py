"""The CPU worker's HTTP server: vLLM's contract, served by faster-whisper.

Same endpoints, request fields, error shape and stream chunks as `vllm serve`, so the
frontend and the operator treat both engines alike -- plus what vLLM lacks: `srt`, `vtt`,
plain `text`, word timestamps, and 413 for oversize uploads.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.datastructures import UploadFile

from transcription_api.openai import (
    ChunkChoice,
    ChunkDelta,
    ChunkUsage,
    ModelCard,
    ModelList,
    ResponseFormat,
    TranscriptionChunk,
    VerboseTranscription,
    Word,
)
from transcription_api.openai import (
    Segment as SegmentModel,
)

from . import metrics
from .engine import AudioError, Job, Lane, Options, QueueFull, Segment, decode


@dataclass
class WorkerConfig:
    served_names: list[str]
    model_path: str
    max_upload_bytes: int = 1024**3
    max_duration_s: float = 4 * 3600.0


class WorkerError(Exception):
    """An error in vLLM's shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(
        self, status: int, message: str, param: str | None = None, retry_after: int | None = None
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.retry_after = (
            status,
            message,
            param,
            retry_after,
        )

    def response(self) -> JSONResponse:
        kind = {
            400: "BadRequestError",
            404: "NotFoundError",
            413: "RequestEntityTooLarge",
            503: "ServiceUnavailableError",
        }.get(self.status, "InternalServerError")
        headers = {"Retry-After": str(self.retry_after)} if self.retry_after else None
        body = {
            "error": {
                "message": self.message,
                "type": kind,
                "param": self.param,
                "code": self.status,
            }
        }
        return JSONResponse(body, status_code=self.status, headers=headers)


def _flag(value: str | None) -> bool:
    return (value or "").strip().lower() in ("true", "1")


async def read_form(request: Request, cfg: WorkerConfig) -> tuple[dict[str, Any], UploadFile]:
    length = request.headers.get("content-length")
    if length and length.isdigit() and int(length) > cfg.max_upload_bytes + 1024 * 1024:
        raise WorkerError(413, f"File too large: the limit is {cfg.max_upload_bytes} bytes", "file")
    try:
        form = await request.form(max_part_size=1024 * 1024)
    except Exception as e:
        raise WorkerError(400, f"could not parse the multipart form: {e}") from e
    fields: dict[str, Any] = {}
    upload: UploadFile | None = None
    for k, v in form.multi_items():
        if isinstance(v, str):
            if k.endswith("[]"):
                fields.setdefault(k[:-2], []).append(v)
            else:
                fields[k] = v
        elif k == "file":
            upload = v
    if upload is None:
        raise WorkerError(400, "the `file` part is missing", "file")
    if (upload.size or 0) > cfg.max_upload_bytes:
        raise WorkerError(413, f"File too large: the limit is {cfg.max_upload_bytes} bytes", "file")
    return fields, upload


def parse_options(
    fields: dict[str, Any], task: str, multilingual: bool
) -> tuple[Options, ResponseFormat]:
    try:
        fmt = ResponseFormat(fields.get("response_format", "json"))
    except ValueError as e:
        raise WorkerError(
            400,
            "response_format must be one of json, text, srt, vtt, verbose_json",
            "response_format",
        ) from e
    try:
        temperature = float(fields.get("temperature", 0.0))
    except ValueError as e:
        raise WorkerError(400, "temperature must be a number", "temperature") from e
    if not 0 <= temperature <= 1:
        raise WorkerError(400, f"temperature must be in [0, 1], got {temperature}", "temperature")
    language = (fields.get("language") or "").strip().lower() or None
    if language and not multilingual and language != "en":
        raise WorkerError(
            400, f"this model is English-only; language {language!r} is not supported", "language"
        )
    if language:
        from faster_whisper.tokenizer import _LANGUAGE_CODES

        if language not in _LANGUAGE_CODES:
            raise WorkerError(400, f"Unsupported language: {language!r}", "language")
    granularities = fields.get("timestamp_granularities", [])
    words = "word" in granularities
    return Options(
        task=task,
        language=language,
        prompt=fields.get("prompt") or None,
        temperature=temperature,
        words=words,
    ), fmt


def verbose(
    segments: list[Segment], info: dict[str, Any], task: str, words: bool
) -> VerboseTranscription:
    return VerboseTranscription(
        task=task,
        language=info["language"],
        duration=info["duration"],
        text="".join(s.text for s in segments),
        segments=[
            SegmentModel(
                id=s.id,
                seek=0,
                start=s.start,
                end=s.end,
                text=s.text,
                tokens=s.tokens,
                temperature=s.temperature,
                avg_logprob=s.avg_logprob,
                compression_ratio=s.compression_ratio,
                no_speech_prob=s.no_speech_prob,
            )
            for s in segments
        ],
        words=[Word(word=w, start=a, end=b) for s in segments for w, a, b in s.words]
        if words
        else None,
    )


def create_app(cfg: WorkerConfig, lane: Lane) -> FastAPI:
    primary = cfg.served_names[0]
    started = int(time.time())

    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        lane.start()
        yield
        await lane.stop()

    app = FastAPI(title="transcription worker (faster-whisper)", lifespan=lifespan)  # type: ignore[arg-type]

    async def handle(request: Request, task: str) -> Response:
        t0 = time.perf_counter()
        try:
            fields, upload = await read_form(request, cfg)
            model = fields.get("model") or primary
            if model not in cfg.served_names:
                raise WorkerError(
                    404,
                    f"The model `{model}` does not exist. Valid aliases: "
                    + ", ".join(cfg.served_names)
                    + ".",
                    "model",
                )
            options, fmt = parse_options(fields, task, lane.transcriber.multilingual)
            stream = _flag(fields.get("stream"))
            if stream and fmt not in (ResponseFormat.JSON, ResponseFormat.TEXT):
                raise WorkerError(400, f"{fmt.value} format doesn't support streaming", "stream")
            try:
                audio = await asyncio.to_thread(decode, upload.file)
            except AudioError as e:
                raise WorkerError(400, str(e), "file") from e
            finally:
                await upload.close()
            seconds = audio.shape[0] / 16000
            if seconds > cfg.max_duration_s:
                raise WorkerError(
                    400,
                    f"the audio is {seconds:.0f} s long; the limit is {cfg.max_duration_s:.0f} s",
                    "file",
                )
            job = Job(audio=audio, options=options)
            try:
                lane.submit(job)
            except QueueFull as e:
                metrics.REJECTED.inc()
                raise WorkerError(
                    503, f"the worker is busy ({e}); retry shortly", retry_after=2
                ) from e
            metrics.WAITING.labels(model_name=primary).set(lane.waiting)
            if stream:
                return StreamingResponse(
                    stream_chunks(job, model, _flag(fields.get("stream_include_usage")), t0),
                    media_type="text/event-stream",
                )
            return await collect(request, job, fmt, t0)
        except WorkerError as e:
            return e.response()

    async def collect(request: Request, job: Job, fmt: ResponseFormat, t0: float) -> Response:
        segments: list[Segment] = []
        info: dict[str, Any] = {}
        while True:
            get = asyncio.ensure_future(job.events.get())
            while not get.done():
                done, _ = await asyncio.wait({get}, timeout=0.25)
                if not done and await request.is_disconnected():
                    get.cancel()
                    job.cancelled.set()  # skipped if waiting, stopped between segments if running
                    metrics.CANCELLED.inc()
                    return Response(status_code=499)
            kind, value = get.result()
            if kind == "info":
                info = value
            elif kind == "segment":
                segments.append(value)
            elif kind == "error":
                raise WorkerError(500, f"transcription failed: {value}")
            else:
                break
        observe(job, t0)
        v = verbose(segments, info, job.options.task, job.options.words)
        if fmt == ResponseFormat.VERBOSE_JSON:
            return JSONResponse(v.model_dump(exclude_none=True))
        if fmt == ResponseFormat.SRT:
            return PlainTextResponse(v.to_srt())
        if fmt == ResponseFormat.VTT:
            return PlainTextResponse(v.to_vtt(), media_type="text/vtt")
        if fmt == ResponseFormat.TEXT:
            return PlainTextResponse(v.text.strip() + "\n")
        return JSONResponse(
            {"text": v.text, "usage": {"type": "duration", "seconds": math.ceil(v.duration)}}
        )

    async def stream_chunks(job: Job, model: str, usage: bool, t0: float) -> AsyncIterator[bytes]:
        rid, created = f"transcribe-{uuid.uuid4().hex[:16]}", int(time.time())
        tokens = 0

        def chunk(**kw: Any) -> bytes:
            c = TranscriptionChunk(id=rid, created=created, model=model, **kw)
            return f"data: {c.model_dump_json(exclude_none=True)}\n\n".encode()

        try:
            while True:
                kind, value = await job.events.get()
                if kind == "segment":
                    tokens += len(value.tokens)
                    yield chunk(choices=[ChunkChoice(delta=ChunkDelta(content=value.text))])
                elif kind == "error":
                    err = {
                        "error": {
                            "message": f"transcription failed: {value}",
                            "type": "InternalServerError",
                            "code": 500,
                        }
                    }
                    yield f"data: {json.dumps(err)}\n\n".encode()
                    break
                elif kind == "done":
                    yield chunk(
                        choices=[ChunkChoice(delta=ChunkDelta(content=""), finish_reason="stop")]
                    )
                    if usage:
                        yield chunk(
                            choices=[],
                            usage=ChunkUsage(completion_tokens=tokens, total_tokens=tokens),
                        )
                    observe(job, t0)
                    break
            yield b"data: [DONE]\n\n"
        finally:
            job.cancelled.set()  # a client that left mid-stream stops the job (no-op if done)

    def observe(job: Job, t0: float) -> None:
        metrics.E2E.labels(model_name=primary).observe(time.perf_counter() - t0)
        metrics.SUCCESS.labels(model_name=primary, finished_reason="stop").inc()
        metrics.AUDIO_SECONDS.inc(job.duration)

    @app.post("/v1/audio/transcriptions")
    async def transcriptions(request: Request) -> Response:
        return await handle(request, "transcribe")

    @app.post("/v1/audio/translations")
    async def translations(request: Request) -> Response:
        return await handle(request, "translate")

    @app.get("/v1/models")
    async def models() -> ModelList:
        return ModelList(
            data=[
                ModelCard(id=n, created=started, owned_by="faster-whisper", root=cfg.model_path)
                for n in cfg.served_names
            ]
        )

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/metrics")
    async def metrics_endpoint() -> Response:
        metrics.RUNNING.labels(model_name=primary).set(lane.running)
        metrics.WAITING.labels(model_name=primary).set(lane.waiting)
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    return app

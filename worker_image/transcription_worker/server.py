"""The CPU worker's HTTP server: vLLM's contract, served by faster-whisper.

Same endpoints, request fields, error shape and stream chunks as `vllm serve`, so the
frontend and the operator treat both engines alike -- plus what vLLM lacks: `srt`, `vtt`,
plain `text`, word timestamps, and 413 for oversize uploads. A request marked
`x-transcription-priority: background` (the gateway's long-audio chunks) is decoded after
interactive ones (batcher.py).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import closing
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from transcription_api import sse
from transcription_api.capabilities import Engine, Mode
from transcription_api.engines import capability_set
from transcription_api.errors import APIError, bad_request, unavailable
from transcription_api.fields import UNSUPPORTED
from transcription_api.multipart import Upload, check_length, parse_upload
from transcription_api.openai import (
    ChunkChoice,
    ChunkDelta,
    ChunkUsage,
    DurationUsage,
    Language,
    Logprob,
    ModelCard,
    ModelList,
    ResponseFormat,
    TranscriptionChunk,
    TranscriptionRequest,
    VerboseTranscription,
    Word,
)
from transcription_api.openai import (
    Segment as SegmentModel,
)
from transcription_api.params import field as form_field
from transcription_api.params import flag, parse_request
from transcription_api.render import render
from transcription_api.worker import PRIORITY_HEADER, is_background

from . import faster_whisper_compat, metrics
from .batcher import Job, Lane, QueueFull
from .speakers.server import SpeakerService
from .transcriber import AudioError, Options, Segment, decode

log = logging.getLogger("transcription_worker")


def _max_upload() -> int:
    caps = capability_set(Engine.FASTER_WHISPER, Mode.SEQUENTIAL)
    assert caps is not None
    assert caps.max_upload_bytes is not None
    return caps.max_upload_bytes


@dataclass
class WorkerConfig:
    served_names: list[str]
    model_path: str
    max_upload_bytes: int = field(default_factory=_max_upload)  # the capability table's
    max_duration_s: float = 4 * 3600.0


def error_response(e: APIError) -> Response:
    return Response(e.body(), e.status, e.headers, media_type="application/json")


async def read_form(request: Request, cfg: WorkerConfig) -> Upload:
    """The request's form, the file spooled (the same parser as the gateway's)."""
    limit = cfg.max_upload_bytes
    check_length(request.headers.get("content-length"), limit)
    return await parse_upload(request.stream(), request.headers.get("content-type"), limit)


def options(request: TranscriptionRequest, task: str, multilingual: bool) -> Options:
    """The engine's options; refuses languages this model does not know. Several
    `languages[]` restrict its language detection to them."""
    language = request.language
    named = [language] if language else list(request.languages)
    for code in named:
        param = "language" if language else "languages[]"
        if not multilingual and code != "en":
            raise bad_request(
                f"this model is English-only; language {code!r} is not supported", param
            )
        if code not in faster_whisper_compat.language_codes():
            raise bad_request(f"Unsupported language: {code!r}", param)
    if not multilingual and named:
        language = "en"
    return Options(
        task=task,
        language=language,
        languages=tuple(request.languages) if language is None else (),
        prompt=request.prompt or None,
        temperature=request.temperature,
        words="word" in request.timestamp_granularities,
        logprobs=request.logprobs,
    )


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
        usage=DurationUsage(seconds=math.ceil(info["duration"])),
    )


def token_logprobs(segment: Segment) -> list[Logprob]:
    """A segment's tokens as OpenAI's `logprobs` entries."""
    return [
        Logprob(token=text, logprob=round(lp, 6), bytes=list(text.encode()))
        for text, lp in segment.logprobs
    ]


def create_app(cfg: WorkerConfig, lane: Lane, speakers: SpeakerService | None = None) -> FastAPI:
    """The worker's app; with `speakers`, its speaker stage too (POST /v1/audio/diarization)."""
    primary = cfg.served_names[0]
    started = int(time.time())

    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        lane.start()
        yield
        await lane.stop()

    app = FastAPI(title="transcription worker (faster-whisper)", lifespan=lifespan)  # type: ignore[arg-type]
    if speakers is not None:
        app.add_route("/v1/audio/diarization", speakers.endpoint, methods=["POST"])

    async def handle(request: Request, task: str) -> Response:
        t0 = time.perf_counter()
        trace = request.headers.get("traceparent")
        if trace:  # the frontend traces (spec.tracing): the span this request belongs to
            log.info("%s request_id=%s traceparent=%s", request.url.path,
                     request.headers.get("x-request-id", ""), trace[:100])  # fmt: skip
        try:
            with closing(await read_form(request, cfg)) as upload:
                model = form_field(upload.fields, "model") or primary
                if model not in cfg.served_names:
                    raise APIError(
                        404,
                        f"The model `{model}` does not exist. Valid aliases: "
                        + ", ".join(cfg.served_names)
                        + ".",
                        param="model",
                    )
                params = parse_request(upload.fields)
                if params.diarized:
                    raise bad_request(
                        "response_format=diarized_json needs the speaker stage (capability "
                        "diarization), which this worker does not run",
                        "response_format",
                        code=UNSUPPORTED,
                    )
                opts = options(params, task, lane.transcriber.multilingual)
                include_usage = flag(form_field(upload.fields, "stream_include_usage"))
                try:
                    assert upload.file is not None  # parse_upload guarantees a file
                    audio = await asyncio.to_thread(decode, upload.file)
                except AudioError as e:
                    raise bad_request(str(e), "file", code="invalid_audio") from e
            seconds = audio.shape[0] / 16000
            if seconds > cfg.max_duration_s:
                raise bad_request(
                    f"the audio is {seconds:.0f} s long; the limit is {cfg.max_duration_s:.0f} s",
                    "file",
                )
            # The gateway's own background work (long audio's chunks) waits for interactive
            # requests' windows (batcher.py); an unknown value is interactive.
            background = is_background(request.headers.get(PRIORITY_HEADER))
            job = Job(audio=audio, options=opts, background=background)
            try:
                lane.submit(job)
            except QueueFull as e:
                metrics.REJECTED.inc()
                raise unavailable(f"the worker is busy ({e}); retry shortly", 2) from e
            metrics.WAITING.labels(model_name=primary).set(lane.waiting)
            if params.stream:
                return StreamingResponse(
                    stream_chunks(job, model, include_usage, t0),
                    media_type=sse.MEDIA_TYPE,
                    headers=sse.HEADERS,
                )
            return await collect(request, job, params.response_format, t0, bool(params.languages))
        except APIError as e:
            return error_response(e)

    async def collect(
        request: Request, job: Job, fmt: ResponseFormat, t0: float, named_languages: bool
    ) -> Response:
        """The whole answer; `languages` in json where the request named languages[]."""
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
                raise failed(value)
            else:
                break
        observe(job, t0)
        answer = verbose(segments, info, job.options.task, job.options.words)
        languages = [Language(code=answer.language)] if named_languages else None
        logprobs = (
            [lp for s in segments for lp in token_logprobs(s)] if job.options.logprobs else None
        )
        out = render(fmt, answer, languages=languages, logprobs=logprobs)
        return Response(out.body, media_type=out.content_type)

    async def stream_chunks(job: Job, model: str, usage: bool, t0: float) -> AsyncIterator[bytes]:
        rid, created = f"transcribe-{uuid.uuid4().hex[:16]}", int(time.time())
        tokens = 0

        def chunk(**kw: Any) -> bytes:
            return sse.encode(TranscriptionChunk(id=rid, created=created, model=model, **kw))

        try:
            while True:
                kind, value = await job.events.get()
                if kind == "segment":
                    tokens += len(value.tokens)
                    choice = ChunkChoice(delta=ChunkDelta(content=value.text))
                    if job.options.logprobs:
                        choice.logprobs = token_logprobs(value)
                    yield chunk(choices=[choice])
                elif kind == "error":
                    yield sse.encode(failed(value).event())
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
            yield sse.DONE
        finally:
            job.cancelled.set()  # a client that left mid-stream stops the job (no-op if done)

    def failed(cause: object) -> APIError:
        return APIError(500, f"transcription failed: {cause}", code="transcription_failed")

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

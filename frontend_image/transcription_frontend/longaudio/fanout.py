"""Long audio, whole: when to chunk a request, and the chunks fanned out and stitched.

A request is chunked when it sets `chunking_strategy`, when its audio (by its header) is
longer than `threshold_seconds`, or when no pool's engine takes it whole (longer than the
engine's `max_audio_seconds`, or larger than its upload limit). Then:
1. the upload is decoded as a stream into 16 kHz mono PCM, spooled to disk (`audio.decode`);
2. Silero VAD finds the silences, and the audio is cut in them, each chunk at most
   `max_chunk_seconds` (`cut`);
3. each chunk, as 16 kHz FLAC, is a request of its own into the pipeline (subrequest.py):
   the pool's least-loaded ready worker takes it, a worker that fails before answering is
   replaced by another, a pool at zero is woken and the chunk held; at most
   `max_parallel_chunks` chunks of a request run at once, each marked background work
   (`PRIORITY_HEADER`): a faster-whisper worker decodes interactive requests' windows
   first. Each chunk is its tenant's request in a busy pool's fair order, tagged with its
   own seconds (fair.py), and is not charged to the tenant's quota: the file was, whole.
   With `previous_text` (Whisper pools), the chunks form `max_parallel_chunks` runs of
   consecutive chunks: each run goes in order, each chunk prompted with the text of the
   one before it (after the client's own prompt), as Whisper conditions each window on the
   text before it inside one file;
4. the answers are stitched into one (stitch.py), in the format asked for; a stream sends
   each chunk's text as soon as it and every chunk before it are done.
A client that disconnects cancels every chunk still running; a chunk that fails fails the
request, naming the chunk. For autoscaling, the request's ticket counts the whole file's
audio until it has been cut, then the chunks' that have not started, as queued: each one
counts as a request of its own once it starts (work.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable
from typing import TYPE_CHECKING, Any

from transcription_api import sse
from transcription_api.capabilities import Capability, ModelFamily
from transcription_api.chunking import FIELD, ChunkingStrategy
from transcription_api.errors import APIError
from transcription_api.frontend import ChunkingSpec
from transcription_api.multipart import Upload
from transcription_api.openai import (
    SEGMENT_FORMATS,
    DurationUsage,
    ErrorEvent,
    TextDelta,
    TextDone,
    TranscriptionRequest,
)
from transcription_api.render import billed_seconds, render
from transcription_api.routes import PoolRoute, RouteTable

from .. import metrics
from ..request_id import request_id
from ..respond import Reply
from ..routing import NoPool
from ..sniff import AudioInfo
from ..subrequest import CHUNK, Caller, Pipeline, post
from ..tracing import Span, context_of
from ..work import Ticket
from .stitch import logprobs, stitch

if TYPE_CHECKING:
    from ..audio.decode import Decoded
    from .cut import Chunk

# The audio package and `cut` (PyAV, numpy, and Silero in onnxruntime: 57 MB of a gateway's
# memory) are imported by the first request that is chunked, not by every gateway.

log = logging.getLogger("transcription_frontend.longaudio")

AUTO = ChunkingStrategy()
# The end of the previous chunk's text that prompts the next (Whisper reads ~223 tokens).
PREVIOUS_WORDS = 100


def plan(
    cfg: ChunkingSpec, strategy: ChunkingStrategy | None, audio: AudioInfo, size: int,
    pools: list[PoolRoute] | NoPool,
) -> ChunkingStrategy | None:  # fmt: skip
    """How to chunk this request (whose deployment's candidate pools are `pools`), or None
    to send it whole."""
    if strategy is not None:
        return strategy
    if not cfg.enabled:
        return None
    if audio.seconds is not None and audio.seconds > cfg.threshold_seconds:
        return AUTO
    if isinstance(pools, NoPool):
        return AUTO if pools.too_large_for else None
    limits = [p.capability_set.max_audio_seconds for p in pools]
    if audio.seconds is not None and all(m is not None and audio.seconds > m for m in limits):
        return AUTO
    return None


def chunk_seconds(cfg: ChunkingSpec, pools: list[PoolRoute] | NoPool) -> float:
    """The longest chunk: the setting, and no longer than a pool's engine takes whole."""
    limits = [cfg.max_chunk_seconds]
    if not isinstance(pools, NoPool):
        limits += [
            p.capability_set.max_audio_seconds
            for p in pools
            if p.capability_set.max_audio_seconds is not None
        ]
    return min(limits)


def _whisper_only(pools: list[PoolRoute] | NoPool) -> bool:
    """Whether every pool a chunk may go to reads a prompt as Whisper does: the transcript
    before the audio (an audio LM reads it as part of its instruction)."""
    return not isinstance(pools, NoPool) and all(p.family == ModelFamily.WHISPER for p in pools)


def runs(chunks: int, parallel: int) -> list[range]:
    """`chunks` in at most `parallel` runs of consecutive chunks, as equal as they come."""
    n = max(1, min(parallel, chunks))
    bounds = [k * chunks // n for k in range(n + 1)]
    return [range(a, b) for a, b in itertools.pairwise(bounds) if b > a]


def chained_prompt(fields: list[tuple[str, str]], previous: str) -> list[tuple[str, str]]:
    """A chunk's fields with the text before it appended to the client's prompt (its last
    PREVIOUS_WORDS words: Whisper reads about 223 tokens of prompt)."""
    words = previous.split()[-PREVIOUS_WORDS:]
    if not words:
        return fields
    own = " ".join(v for k, v in fields if k == "prompt").strip()
    prompt = " ".join([own, *words]) if own else " ".join(words)
    return [*(f for f in fields if f[0] != "prompt"), ("prompt", prompt)]


def chunk_fields(
    fields: list[tuple[str, str]], request: TranscriptionRequest
) -> list[tuple[str, str]]:
    """A chunk's form: the client's fields, less the chunking and the stream, asking for
    segments where the answer needs them."""
    verbose = request.response_format in SEGMENT_FORMATS or bool(request.timestamp_granularities)
    out = [
        (k, v) for k, v in fields
        if not k.startswith(FIELD) and k not in ("stream", "response_format")
    ]  # fmt: skip
    return [*out, ("response_format", "verbose_json" if verbose else "json")]


class _Failed(Exception):
    def __init__(self, error: APIError) -> None:
        super().__init__(error.message)
        self.error = error


async def transcribe_long(
    pipeline: Pipeline, gw: Any, endpoint: Capability, scope: Any, upload: Upload,
    request: TranscriptionRequest, strategy: ChunkingStrategy, needs: frozenset[Capability],
    table: RouteTable, ticket: Ticket,
) -> Reply:  # fmt: skip
    """The whole answer (or stream) of a chunked request to `table`'s deployment; `ticket`
    counts the audio its chunks do not (yet)."""
    from ..audio.decode import CorruptAudio, decode

    cfg: ChunkingSpec = gw.settings.chunking
    pools = gw.router.candidates(table, needs, 0)
    assert upload.file is not None
    upload.file.seek(0)
    with gw.tracer.span("longaudio.cut") as span:
        try:
            decoded = await asyncio.to_thread(decode, upload.file)
        except CorruptAudio as e:
            raise APIError(400, str(e), param="file", code="invalid_audio") from None
        span.set("transcription.audio.seconds", round(decoded.seconds, 3))
        try:
            chunks = await _cuts(cfg, gw.settings.max_audio_seconds, pools, decoded, strategy)
        except BaseException:
            decoded.close()
            raise
        span.set("transcription.chunks", len(chunks))
    try:
        metrics.CHUNKED.labels(model=table.model).inc()
        metrics.CHUNKS.observe(len(chunks))
        log.info("%.1f s of audio in %d chunks", decoded.seconds, len(chunks))
        headers = dict(scope["headers"])
        caller = Caller(headers.get(b"authorization"), scope.get("client"), request_id(scope))
        fields = chunk_fields(upload.fields, request)
        chained = cfg.previous_text and _whisper_only(pools)
        runner = _Runner(pipeline, gw, endpoint, decoded, chunks, fields, caller,
                         cfg.max_parallel_chunks, chained, ticket)  # fmt: skip
        if isinstance(pools, NoPool):
            ticket.close()
        else:
            ticket.queued(pools[0].name)  # the chunks, until each starts
            ticket.count(runner.waiting)
        if request.stream:
            return Reply(200, sse.MEDIA_TYPE, stream=_stream(runner, decoded),
                         headers=dict(sse.HEADERS), seconds=None)  # fmt: skip
        answers = await runner.all()
        whole = stitch(answers, decoded.seconds)
        billed = billed_seconds({}, decoded.seconds)
        out = render(request.response_format, whole, seconds=billed,
                     logprobs=logprobs(answers) if request.logprobs else None)  # fmt: skip
        return Reply(200, out.content_type, out.body, seconds=billed)
    finally:
        if not request.stream:
            decoded.close()


async def _cuts(
    cfg: ChunkingSpec, max_audio_seconds: float | None, pools: list[PoolRoute] | NoPool,
    decoded: Decoded, strategy: ChunkingStrategy,
) -> list[Chunk]:  # fmt: skip
    """Where the decoded audio is cut (413 past the deployment's longest audio), for chunks
    that these pools take."""
    from .cut import ChunkSettings, find_cuts

    if max_audio_seconds is not None and decoded.seconds > max_audio_seconds:
        raise too_long(decoded.seconds, max_audio_seconds)
    longest = chunk_seconds(cfg, pools)
    settings = ChunkSettings(
        max_chunk_seconds=longest,
        # late cuts, few chunks: each costs Whisper a whole 30 s window, however short
        target_chunk_seconds=max(longest * 0.8, longest - 1.5),
        threshold=strategy.threshold,
        silence_duration_ms=strategy.silence_duration_ms,
        prefix_padding_ms=strategy.prefix_padding_ms,
        normalize=strategy.type == "auto",
    )
    return await asyncio.to_thread(find_cuts, decoded, settings)


def too_long(seconds: float, limit: float) -> APIError:
    return APIError(
        413,
        f"The audio is {seconds:.1f} s long; this deployment accepts at most {limit:g} s "
        "(spec.frontend.maxAudioSeconds). Split it.",
        param="file", code="audio_too_long",
    )  # fmt: skip


class _Runner:
    """The chunks of one request, at most `parallel` at a time, answers kept in order;
    `chained`: in runs, each chunk prompted with the text of the one before it; `ticket`
    counts the audio of those that have not started."""

    def __init__(
        self, pipeline: Pipeline, gw: Any, endpoint: Capability, decoded: Decoded,
        chunks: list[Chunk], fields: list[tuple[str, str]], caller: Caller, parallel: int,
        chained: bool = False, ticket: Ticket | None = None,
    ) -> None:  # fmt: skip
        self.pipeline = pipeline
        self.gw, self.endpoint, self.decoded, self.chunks = gw, endpoint, decoded, chunks
        self.fields, self.caller, self.chained = fields, caller, chained
        self.firsts = {r.start for r in runs(len(chunks), parallel)} if chained else set()
        self.slots = asyncio.Semaphore(parallel)
        self.tasks: list[asyncio.Task[dict[str, Any]]] = []
        self.ticket = ticket
        self.unstarted = len(chunks)
        self.waiting = sum(c.seconds for c in chunks)  # audio seconds not started
        # The chunks' parent span: from here until the last chunk ends (`cancel`).
        self.span: Span | None = gw.tracer.start(
            "longaudio.fanout",
            {"transcription.chunks": len(chunks), "transcription.max_parallel": parallel},
        )

    def start(self) -> None:
        if not self.tasks:
            for i, c in enumerate(self.chunks):
                before = self.tasks[i - 1] if self.chained and i not in self.firsts else None
                self.tasks.append(asyncio.create_task(self._one(c, before)))

    async def _one(
        self, chunk: Chunk, before: asyncio.Task[dict[str, Any]] | None
    ) -> dict[str, Any]:
        from .cut import encode

        fields = self.fields
        if before is not None:  # its run's previous chunk: its text is this one's prompt
            with contextlib.suppress(_Failed):  # that one fails the request, this one with it
                fields = chained_prompt(fields, str((await before).get("text") or ""))
        attributes = {
            "transcription.chunk.index": chunk.index,
            "transcription.chunk.start": round(chunk.start, 3),
            "transcription.chunk.end": round(chunk.end, 3),
            "transcription.chunk.previous_text": before is not None,
        }
        parent = context_of(self.span) if self.span else None
        async with self.slots:
            self._started(chunk)
            with self.gw.tracer.span("longaudio.chunk", attributes, parent=parent) as span:
                flac = await asyncio.to_thread(encode, self.decoded, chunk)
                started = time.monotonic()
                status, body = await post(
                    self.pipeline, self.gw, self.endpoint, fields, flac, "chunk.flac",
                    "audio/flac", self.caller, CHUNK,
                )  # fmt: skip
                metrics.CHUNK_SECONDS.observe(time.monotonic() - started)
                span.set("http.response.status_code", status)
        if status != 200:
            raise _Failed(_chunk_error(chunk, len(self.chunks), status, body))
        answer: dict[str, Any] = json.loads(body)
        return answer

    def _started(self, chunk: Chunk) -> None:
        """`chunk` starts: its own request counts its audio from here."""
        self.unstarted -= 1
        self.waiting -= chunk.seconds
        if self.ticket is not None:
            if self.unstarted:
                self.ticket.count(self.waiting)
            else:
                self.ticket.close()

    def in_order(self) -> list[Awaitable[dict[str, Any]]]:
        self.start()
        return list(self.tasks)

    async def all(self) -> list[tuple[Chunk, dict[str, Any]]]:
        try:
            answers = [await t for t in self.in_order()]
        except _Failed as e:
            raise e.error from None
        finally:
            self.cancel()
        return list(zip(self.chunks, answers, strict=True))

    def cancel(self) -> None:
        """Cancel the chunks still running (none once all are done), and end the span."""
        for t in self.tasks:
            t.cancel()
        if self.span is not None:
            self.span.end()
            self.span = None


def _chunk_error(chunk: Chunk, total: int, status: int, body: bytes) -> APIError:
    try:
        err = json.loads(body)["error"]
        message, type_ = str(err.get("message")), err.get("type")
    except (ValueError, KeyError, TypeError, AttributeError):
        message, type_ = body.decode("utf-8", "replace")[:300], None
    return APIError(
        status,
        f"chunk {chunk.index + 1} of {total} ({chunk.start:.1f}-{chunk.end:.1f} s) failed: "
        f"{message}",
        param="file", type=type_,
    )  # fmt: skip


async def _stream(runner: _Runner, decoded: Decoded) -> AsyncIterator[bytes]:
    """Each chunk's text as a delta once it and every chunk before it are done; then the
    whole text with the audio's seconds; an error event if a chunk fails."""
    texts: list[str] = []
    try:
        for task in runner.in_order():
            try:
                answer = await task
            except _Failed as e:
                yield sse.encode(ErrorEvent(error=e.error.detail))
                return
            text = str(answer.get("text") or "").strip()
            if text:
                yield sse.encode(TextDelta(delta=(" " if texts else "") + text))
                texts.append(text)
        seconds = billed_seconds({}, decoded.seconds) or 0
        done = TextDone(text=" ".join(texts), usage=DurationUsage(seconds=seconds))
        yield sse.encode(done)
        yield sse.DONE
    finally:
        runner.cancel()
        decoded.close()

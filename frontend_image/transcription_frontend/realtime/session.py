"""One realtime transcription session: its configuration, its input audio buffer, turn
detection, and the turns it sends to the pools.

The buffer holds the audio not yet committed, as 16-bit PCM at the input format's rate.
With `server_vad`, Silero VAD (`audio.vad`) finds where speech starts and stops; each stop
commits the turn's audio (from its start, prefix padding included, to the stop, trailing
silence included), as OpenAI's server VAD does. With `turn_detection: null` the client
commits. Each committed turn becomes a conversation item and a transcription through the
pipeline (turns.py). Its events follow OpenAI's order: committed, item added, deltas,
completed (or failed), item done.

Back-pressure: at most `MAX_PENDING_TURNS` turns of a session are transcribed at once; a
commit past that waits, and so does the reading of the client's next message, so a client
that sends faster than the pools transcribe is slowed down by TCP, never buffered without
bound. The uncommitted buffer is bounded by `realtime_max_buffer_seconds` (the frontend's
limits): with server VAD a longer turn is committed there (its speech_stopped says so),
without it an append past it is refused.

Memory: an append is refused by the size its base64 tells before any of it is decoded
(`realtime_max_append_bytes`), then decoded, converted and scored by the VAD one window
(`WINDOW_CHARS`) at a time, the loop free between windows: what it costs beyond the text
the WebSocket delivered does not grow with its size. The buffer counts its bytes in the
frontend's memory budget (`bufferedBodyBytes`, with the chat bodies held): an append that
would pass it is refused whole (`memory_budget_exceeded`), before any of it is decoded.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import re
import time
from collections.abc import Awaitable, Callable

from pydantic import BaseModel

from transcription_api.capabilities import Capability, request_needs
from transcription_api.errors import APIError
from transcription_api.openai import DurationUsage, Logprob
from transcription_api.realtime import (
    LOGPROBS,
    Append,
    Clear,
    Cleared,
    Commit,
    Committed,
    Content,
    ErrorBody,
    EventError,
    Item,
    ItemAdded,
    ServerVad,
    SessionCreated,
    SessionUpdate,
    SpeechStarted,
    SpeechStopped,
    TranscriptCompleted,
    TranscriptDelta,
    TranscriptFailed,
    TranscriptionSession,
    item_id,
    validate_session,
)
from transcription_api.routes import RouteTable

from .. import metrics
from ..audio import vad
from ..audio.encode import wav
from ..audio.pcm import FORMATS, To16k, denoise, to_pcm16
from ..gateway import Gateway
from ..routing import NoPool
from ..subrequest import Caller
from ..tracing import Attributes, Parent
from .turns import TurnFailed, transcribe_turn

log = logging.getLogger("transcription_frontend.realtime")

MIN_COMMIT_MS = 100  # OpenAI's: a commit of less audio is an error
# An append is decoded and scored this much base64 at a time: 48,000 bytes, 1 s of 24 kHz
# PCM16 (a multiple of 4 characters, and of 2 bytes decoded: whole samples).
WINDOW_CHARS = 64_000
_BASE64 = re.compile(r"[A-Za-z0-9+/]*={0,2}")

# Turns of one session transcribed at once; a commit past it waits (back-pressure).
MAX_PENDING_TURNS = 4


Emit = Callable[[BaseModel], Awaitable[None]]


class Session:
    def __init__(
        self, gw: Gateway, emit: Emit, *, authorization: bytes | None,
        client: tuple[str, int] | None = None, request_id: str = "",
        model: str | None = None, trace: Parent | None = None,
    ) -> None:  # fmt: skip
        self.gw, self.emit, self.limits = gw, emit, gw.settings.limits
        self.trace = trace  # the upgrade's traceparent: each turn's span is its child
        self.authorization = authorization
        self.caller = Caller(authorization, client, request_id)
        self.config = TranscriptionSession()
        if model is not None:
            self.config = self.config.updated(
                {"audio": {"input": {"transcription": {"model": model}}}}
            )
        self.elapsed_ms = 0.0  # audio written this session
        # The buffer's bytes, counted in the frontend's memory budget (bufferedBodyBytes).
        self.held = gw.body_budget.holder("realtime append")
        self.pending = 0  # bytes of the append being decoded, not yet in the buffer
        self._set_format()
        self.speech: tuple[str, int] | None = None  # the turn in speech: item id, start ms
        self.previous: str | None = None  # the last committed item
        self.turns: set[asyncio.Task[None]] = set()
        self.slots = asyncio.Semaphore(MAX_PENDING_TURNS)

    # ---- configuration

    def _set_format(self) -> None:
        """A new format or turn detection: the buffer and the VAD start again."""
        self.rate = FORMATS[self.config.input.format.type]
        self.buffer = bytearray()
        self._count()
        self.buffer_start_ms = self.elapsed_ms
        self.to16k = To16k(self.rate)
        td = self.config.input.turn_detection
        self.detector: vad.TurnDetector | None = None
        if isinstance(td, ServerVad):
            settings = vad.ServerVad(td.threshold, td.prefix_padding_ms, td.silence_duration_ms)
            self.detector = vad.TurnDetector(settings, vad.Silero())
            self.detector.reset(round(self.elapsed_ms))

    async def start(self) -> None:
        await self.emit(SessionCreated(session=self.config))

    async def handle(self, event: SessionUpdate | Append | Commit | Clear) -> None:
        if isinstance(event, SessionUpdate):
            await self._update(event)
        elif isinstance(event, Append):
            await self._append(event)
        elif isinstance(event, Commit):
            await self._commit_all(event.event_id)
        else:
            self.buffer.clear()
            self._count()
            self.buffer_start_ms = self.elapsed_ms
            self.speech = None
            if self.detector is not None:
                self.detector.reset(round(self.elapsed_ms))
            await self.emit(Cleared())

    async def _update(self, event: SessionUpdate) -> None:
        new = validate_session(self.config, event.session, event.event_id)
        try:
            self.gw.router.catalog.check_session(
                new.input.transcription.model, self.gw.caller(self._auth())
            )
        except APIError as e:
            raise EventError(e.message, code=e.code or "model_not_found",
                             param="session.audio.input.transcription.model",
                             event_id=event.event_id) from None  # fmt: skip
        self._check_pools(new, event.event_id)
        old, self.config = self.config, new
        self.gw.sessions.use(self, self.pool())
        if (old.input.format, old.input.turn_detection) != (
            new.input.format,
            new.input.turn_detection,
        ):
            self._set_format()
        await self.emit(SessionCreated(type="session.updated", session=self.config))

    def needs(self, config: TranscriptionSession | None = None) -> frozenset[Capability]:
        c = config or self.config
        t = c.input.transcription
        return request_needs(Capability.TRANSCRIPTIONS, stream=True, keywords=bool(t.keywords),
                             languages=len(t.languages or []),
                             logprobs=LOGPROBS in (c.include or []))  # fmt: skip

    def table(self, config: TranscriptionSession | None = None) -> RouteTable | None:
        """The route table of the deployment the session's turns go to: its model's (the
        one deployment's of a one-deployment file, when it names none); None while it
        names none the gateway routes."""
        try:
            return self.gw.router.catalog.resolve((config or self.config).input.transcription.model)
        except APIError:
            return None

    def pool(self) -> str | None:
        """The pool this session's turns go to first (its load, for autoscaling)."""
        table = self.table()
        if table is None:
            return None
        for needs in (self.needs(), self.needs() - {Capability.STREAM}):
            pools = self.gw.router.candidates(table, needs, 0)
            if not isinstance(pools, NoPool):
                return pools[0].name
        return None

    def _check_pools(self, new: TranscriptionSession, event_id: str | None) -> None:
        """A setting no pool can serve is refused now, naming it, not turn after turn."""
        t = new.input.transcription
        wanted = {
            "session.include": request_needs(Capability.TRANSCRIPTIONS,
                                             logprobs=LOGPROBS in (new.include or [])),
            "session.audio.input.transcription.keywords": request_needs(
                Capability.TRANSCRIPTIONS, keywords=bool(t.keywords)),
            "session.audio.input.transcription.languages": request_needs(
                Capability.TRANSCRIPTIONS, languages=len(t.languages or [])),
        }  # fmt: skip
        table = self.table(new)
        if table is None:
            return  # no model yet: each turn's failure will name the valid ones
        for param, needs in wanted.items():
            pools = self.gw.router.candidates(table, needs, 0)
            if isinstance(pools, NoPool):
                missing = ", ".join(sorted(pools.missing))
                raise EventError(
                    f"No pool of this deployment can serve '{param}': missing capability "
                    f"{missing}.", code="unsupported_capability", param=param, event_id=event_id,
                )  # fmt: skip

    def _auth(self) -> str | None:
        return self.authorization.decode("latin-1") if self.authorization else None

    # ---- audio

    async def _append(self, event: Append) -> None:
        pcm_bytes = self._check_append(event)
        try:  # counted in whole before any of it is decoded
            self.held.reserve(len(self.buffer) + pcm_bytes)
        except APIError as e:
            raise EventError(e.message, code=e.code or "memory_budget_exceeded", param="audio",
                             event_id=event.event_id, type="server_error") from None  # fmt: skip
        self.pending = pcm_bytes
        try:
            await self._decode(event)
        finally:
            self.pending = 0
            self._count()

    def _count(self) -> None:
        """The memory budget counts the buffer and what the append being decoded will add."""
        self.held.settle(len(self.buffer) + self.pending)

    async def _decode(self, event: Append) -> None:
        fmt = self.config.input.format.type
        for i in range(0, len(event.audio), WINDOW_CHARS):
            pcm = to_pcm16(fmt, base64.b64decode(event.audio[i : i + WINDOW_CHARS]))
            self.buffer += pcm
            self.pending -= len(pcm)
            self.elapsed_ms += len(pcm) / 2 / self.rate * 1000
            if self.detector is None:
                await asyncio.sleep(0)  # the loop serves others between windows
                continue
            for ev in await asyncio.to_thread(self._detect, pcm):
                if isinstance(ev, vad.SpeechStarted):
                    await self._speech_started(ev.audio_start_ms)
                else:
                    await self._speech_stopped(ev.audio_end_ms)
            await self._bound()

    def _check_append(self, event: Append) -> int:
        """EventError unless the append may be taken: checked on its base64 text, before any
        of it is decoded. Its length as PCM16, the buffer's format."""
        audio, limits = event.audio, self.limits
        if len(audio) % 4 or not _BASE64.fullmatch(audio):
            raise EventError("'audio' is not valid base64.", code="invalid_value", param="audio",
                             event_id=event.event_id)  # fmt: skip
        size = len(audio) // 4 * 3 - audio[-2:].count("=")
        if size > limits.realtime_max_append_bytes:
            raise EventError(
                f"An append may carry at most {limits.realtime_max_append_bytes} bytes of audio "
                f"(realtimeMaxAppendBytes); this one has {size}. Send the audio in smaller "
                "appends.",
                code="append_too_large", param="audio", event_id=event.event_id,
            )  # fmt: skip
        fmt = self.config.input.format.type
        if fmt == "audio/pcm" and size % 2:
            raise EventError(
                f"'audio' is not {fmt} audio: 16-bit samples are 2 bytes each; got an odd byte "
                f"count ({size})", code="invalid_value", param="audio", event_id=event.event_id,
            )  # fmt: skip
        samples = size // 2 if fmt == "audio/pcm" else size  # G.711: a byte a sample
        cap = limits.realtime_max_buffer_seconds
        if self.detector is None and self._buffered_s() + samples / self.rate > cap:
            raise EventError(
                f"The input audio buffer holds at most {cap:g} s (realtimeMaxBufferSeconds); "
                "commit (input_audio_buffer.commit) or clear it first.",
                code="input_audio_buffer_full", param="audio", event_id=event.event_id,
            )  # fmt: skip
        return samples * 2

    def _detect(self, pcm: bytes) -> list[vad.SpeechStarted | vad.SpeechStopped]:
        assert self.detector is not None
        return self.detector.feed(self.to16k.feed(pcm))

    def _buffered_s(self) -> float:
        return len(self.buffer) / 2 / self.rate

    async def _speech_started(self, start_ms: int) -> None:
        item = item_id()
        self.speech = (item, max(start_ms, round(self.buffer_start_ms)))
        await self.emit(SpeechStarted(audio_start_ms=start_ms, item_id=item))

    async def _speech_stopped(self, end_ms: int) -> None:
        if self.speech is None:
            return
        item, start = self.speech
        self.speech = None
        await self.emit(SpeechStopped(audio_end_ms=end_ms, item_id=item))
        await self._commit(item, start, end_ms)

    async def _bound(self) -> None:
        """Server VAD: a turn longer than realtime_max_buffer_seconds is committed; outside
        speech only the audio a turn's prefix padding may need is kept."""
        if self.speech is not None:
            if self.elapsed_ms - self.speech[1] >= self.limits.realtime_max_buffer_seconds * 1000:
                await self._speech_stopped(round(self.elapsed_ms))
                assert self.detector is not None
                self.detector.reset(round(self.elapsed_ms))
            return
        td = self.config.input.turn_detection
        keep_ms = (td.prefix_padding_ms if isinstance(td, ServerVad) else 0) + 1000
        self._drop_until(self.elapsed_ms - keep_ms)

    def _drop_until(self, ms: float) -> None:
        if ms <= self.buffer_start_ms:
            return
        n = min(len(self.buffer) // 2, round((ms - self.buffer_start_ms) * self.rate / 1000))
        del self.buffer[: n * 2]
        self._count()
        self.buffer_start_ms += n * 1000 / self.rate

    def _take(self, start_ms: float, end_ms: float) -> bytes:
        """The buffer's audio from start to end (session ms), dropping all before end."""
        first = max(0, round((start_ms - self.buffer_start_ms) * self.rate / 1000))
        last = max(first, round((end_ms - self.buffer_start_ms) * self.rate / 1000))
        pcm = bytes(self.buffer[first * 2 : last * 2])
        self._drop_until(end_ms)
        return pcm

    async def _commit_all(self, event_id: str | None) -> None:
        if self._buffered_s() * 1000 < MIN_COMMIT_MS:
            raise EventError(
                f"Error committing input audio buffer: buffer too small. Expected at least "
                f"{MIN_COMMIT_MS}ms of audio, but buffer only has "
                f"{self._buffered_s() * 1000:.2f}ms of audio.",
                code="input_audio_buffer_commit_empty", event_id=event_id,
            )  # fmt: skip
        item = self.speech[0] if self.speech is not None else item_id()
        self.speech = None
        if self.detector is not None:
            self.detector.reset(round(self.elapsed_ms))
        await self._commit(item, self.buffer_start_ms, self.elapsed_ms)

    async def _commit(self, item: str, start_ms: float, end_ms: float) -> None:
        pcm = self._take(start_ms, end_ms)
        previous, self.previous = self.previous, item
        await self.emit(Committed(item_id=item, previous_item_id=previous))
        await self.emit(ItemAdded(item=Item(id=item), previous_item_id=previous))
        await self.slots.acquire()  # back-pressure: see the module's docstring
        task = asyncio.create_task(self._transcribe(item, previous, pcm))
        self.turns.add(task)
        task.add_done_callback(self.turns.discard)

    async def _transcribe(self, item: str, previous: str | None, pcm: bytes) -> None:
        stopped = time.monotonic()
        seconds = len(pcm) / 2 / self.rate
        nr = self.config.input.noise_reduction
        if nr is not None and nr.type is not None:
            pcm = await asyncio.to_thread(denoise, pcm, self.rate, nr.type)
        table = self.table()
        named = self.config.input.transcription.model
        model = named or (table.model if table is not None else "none")  # the metrics' label

        async def delta(text: str, logprobs: list[Logprob] | None) -> None:
            if text:
                await self.emit(TranscriptDelta(item_id=item, delta=text, logprobs=logprobs))

        transcript: str | None = None
        attributes: Attributes = {
            "transcription.item_id": item, "transcription.audio.seconds": round(seconds, 3),
            "transcription.request_id": self.caller.request_id,
        }  # fmt: skip
        try:
            with self.gw.tracer.span("realtime.turn", attributes, parent=self.trace):
                answer = await transcribe_turn(
                    self.gw, table, wav(pcm, self.rate), self.config, self.caller, delta,
                )  # fmt: skip
            transcript = answer.text
            await self.emit(TranscriptCompleted(
                item_id=item, transcript=answer.text, logprobs=answer.logprobs,
                languages=answer.languages,
                usage=DurationUsage(seconds=round(answer.seconds or seconds, 3)),
            ))  # fmt: skip
            metrics.realtime_turn(model, "completed", time.monotonic() - stopped)
        except TurnFailed as e:
            log.info("turn %s failed: %s", item, e.error.message)
            await self.emit(TranscriptFailed(item_id=item, error=e.error))
            metrics.realtime_turn(model, "failed", time.monotonic() - stopped)
        except Exception as e:  # a bug: the turn fails, the session goes on
            log.exception("turn %s", item)
            error = ErrorBody(message=f"internal error: {type(e).__name__}", type="server_error")
            await self.emit(TranscriptFailed(item_id=item, error=error))
            metrics.realtime_turn(model, "failed", time.monotonic() - stopped)
        finally:
            self.slots.release()
        content = Content(transcript=transcript)
        await self.emit(ItemAdded(type="conversation.item.done", previous_item_id=previous,
                                  item=Item(id=item, content=[content])))  # fmt: skip

    async def finish(self, seconds: float) -> None:
        """Let the turns being transcribed end (a drain), at most this long."""
        if self.turns:
            await asyncio.wait(set(self.turns), timeout=seconds)

    async def close(self) -> None:
        """The client is gone: every turn still running is cancelled (and with it the
        worker's request)."""
        self.buffer.clear()
        self.pending = 0
        self._count()
        for task in list(self.turns):
            task.cancel()
        if self.turns:
            await asyncio.wait(set(self.turns), timeout=5)

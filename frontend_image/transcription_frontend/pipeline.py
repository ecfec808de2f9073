"""The request pipeline of `POST /v1/audio/{transcriptions,translations}`, top to bottom.

  1. key        the API key, if keys are configured, and its tenant       (auth.py,
                (one `Authorization` header); the upload is counted       tenants.py,
                against its key's cap until its body has arrived          limits.py)
  2. upload     the multipart body, streamed and spooled, within the limit (multipart)
  3. request    the form's options, validated into one typed model        (params)
  4. model      the name or alias, resolved to its deployment's route     (catalog.py)
                table and primary model, during step 2: the moment the
                form's `model` field is parsed. An unknown name (404) or
                one the key or its tenant may not use (403) is answered before the file
                after it is read; the deployment's upload limit bounds the
                rest. A `model` after the file: when it arrives (spooled)
  5. audio      an empty or non-audio file is refused here; its container (sniff.py)
                and duration are read from its header, and the tenant's   (quota.py)
                quota is charged its length (429 if it does not fit)
  6. needs      what the request needs from a pool                        (capabilities)
  6b. long     audio that is chunked (chunking_strategy, or too long     (longaudio/)
                for one request) is cut on silence, its chunks sent back
                into this pipeline at once, and stitched into one answer
  7. pools      the pools of that deployment that cover the needs,        (routing.py)
                continuous first, whose engines take its fields,          (adapters/)
                container and duration
  8. forward    to a worker, retried elsewhere if it cannot take it, held  (forward.py,
                while its pools have none (scale from zero), queued in       hold.py,
                fair order between tenants while its workers are busy,      fair.py,
                in the request its engine's adapter makes (an audio          adapters/)
                language model's pool is asked through its chat endpoint)
  9. respond    the answer rendered or streamed to the client, as its     (adapters/,
                engine's adapter reads it                                     respond.py)

Steps 8 and 9 run inside one `async with` that releases the worker connection when the
response has been sent, and inside a watch that cancels both if the client disconnects
(`Exchange.forward`). One `Observation` records the request's metrics once, when it has
ended (`run`), one `Ticket` counts its audio for autoscaling from the moment its length
is known, while the upload still arrives (work.py), and one `Charge` holds what its
tenant's quota was charged, settled to what its answer reports when it has ended, whose
`x-ratelimit-*` headers every answer carries. The chat endpoint's pipeline (`chat.py`) runs
in all three too.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import closing
from dataclasses import dataclass

from starlette.requests import Request
from starlette.types import Message, Receive, Scope, Send

from transcription_api.capabilities import Capability, request_needs
from transcription_api.chunking import parse_chunking
from transcription_api.errors import APIError, bad_request
from transcription_api.multipart import (
    LARGE_FIELDS,
    Limit,
    Upload,
    check_length,
    parse_upload,
)
from transcription_api.openai import TranscriptionRequest
from transcription_api.params import parse_request
from transcription_api.routes import PoolRoute, RouteTable

from . import diarized
from .adapters import Adapter, able, adapter
from .auth import authorization
from .disconnect import cancel_on_disconnect
from .errors import internal_error
from .forward import Body, WorkerAnswer
from .gateway import Gateway
from .hold import Holdable
from .longaudio.fanout import plan, too_long, transcribe_long
from .metrics import Observation
from .quota import Charge
from .request_id import request_id
from .respond import Reply
from .routing import NoPool, Router
from .sniff import AudioInfo, audio_seconds, check_audio
from .streams import EventStream
from .subrequest import CHUNK, PART, TURN, background, kind
from .tenants import Caller
from .work import Ticket


async def transcribe(
    gw: Gateway, endpoint: Capability, scope: Scope, receive: Receive, send: Send
) -> None:
    await run(gw, endpoint.value, scope, receive, send, lambda ex: _pipeline(ex, endpoint))


@dataclass
class Exchange:
    """One request as its pipeline sees it: the gateway, the client's connection (`send`
    tracked: `answered` says whether the response has been sent whole), the request's
    Observation and its audio's Ticket; once its key is checked, its caller, and once its
    audio's length is known, its tenant's Charge."""

    gw: Gateway
    scope: Scope
    receive: Receive
    send: Send
    answered: Callable[[], bool]
    obs: Observation
    ticket: Ticket
    caller: Caller | None = None
    charge: Charge | None = None
    uploaded: Callable[[], None] = lambda: None  # counts its upload out (limits.Uploads)

    def identify(self) -> Caller:
        """Step 1: the key (its one `Authorization` header) and its tenant (`Gateway.caller`);
        a client's upload is counted against its key's (or address's) cap until it arrives."""
        self.caller = self.gw.caller(authorization(self.scope["headers"]))
        if self.caller.key is not None:
            self.obs.key = self.caller.key.label
        if kind(self.scope) is None:
            key, client = self.caller.key, self.scope.get("client")
            who = f"key {key.label}" if key else f"client {client[0] if client else ''}"
            self.receive, self.uploaded = self.gw.uploads.start(who, self.receive)
        return self.caller

    def charged(self, seconds: float) -> None:
        """Charge the tenant's quota for `seconds` of audio (429 if they do not fit); a long
        file's chunks and a diarized request's parts are not: their request was, whole."""
        if self.caller is not None and kind(self.scope) not in (CHUNK, PART):
            self.charge = self.gw.quotas.admit(self.caller.tenant, seconds)

    async def forward(
        self, adapters: list[Adapter], request_for: Callable[[Adapter], tuple[str, Body]],
        held: Holdable, stream: bool, reply_to: Callable[[Adapter, WorkerAnswer], Awaitable[Reply]],
    ) -> None:  # fmt: skip
        """Forward the request to the first of these pools' engines that can take it, in
        the request its adapter makes (`request_for`, once per pool: retries resend the same
        bytes), and send the client the reply to its answer (`reply_to`)."""
        by_pool = {a.pool.name: a for a in adapters}
        requests: dict[str, tuple[str, Body]] = {}

        def request(pool: PoolRoute) -> tuple[str, Body]:
            if pool.name not in requests:
                requests[pool.name] = request_for(by_pool[pool.name])
            return requests[pool.name]

        pools = [a.pool for a in adapters]
        rid, bg = request_id(self.scope), background(self.scope)
        flow = self.caller.flow(interactive=kind(self.scope) == TURN) if self.caller else None
        async with (
            cancel_on_disconnect(self.receive, self.answered),
            self.gw.forwarder.send(pools, request, held, rid, self.ticket, stream, bg,
                                   flow) as answer,
        ):  # fmt: skip
            self.obs.pool = answer.pool.name
            reply = await reply_to(by_pool[answer.pool.name], answer)
            self.obs.status = reply.status
            await reply.send(self.send)
            if isinstance(reply.stream, EventStream) and reply.stream.error:
                self.obs.status = reply.stream.error.status
            else:
                self.obs.audio_seconds = reply.seconds


async def run(
    gw: Gateway, endpoint: str, scope: Scope, receive: Receive, send: Send,
    work: Callable[[Exchange], Awaitable[None]],
) -> None:  # fmt: skip
    """Run a pipeline; answer its APIError (or a bug) in OpenAI's shape; record metrics;
    settle its quota's charge; trace it (one span, the parent of each step's: tracing.py)."""
    obs = Observation(endpoint)
    ticket = gw.work.ticket()
    started = answered = False

    async def send_tracked(message: Message) -> None:
        nonlocal started, answered
        if message["type"] == "http.response.start" and ex.charge is not None:
            limits = ex.charge.standing.headers().items()
            extra = [(k.encode(), v.encode()) for k, v in limits]
            message = {**message, "headers": [*message.get("headers", ()), *extra]}
        started = started or message["type"] == "http.response.start"
        answered = message["type"] == "http.response.body" and not message.get("more_body")
        await send(message)

    ex = Exchange(gw, scope, receive, send_tracked, lambda: answered, obs, ticket)

    path = scope["path"]
    attributes = {"http.request.method": "POST", "http.route": path,
                  "transcription.request_id": request_id(scope)}  # fmt: skip
    with gw.tracer.request(f"POST {path}", scope["headers"], attributes) as span:
        try:
            try:
                await work(ex)
            except APIError as e:
                error = e
            except Exception as e:
                error = internal_error(e)  # a bug: logged, and still answered in OpenAI's shape
            else:
                return
            obs.status = error.status
            span.set("error.type", str(error.status) if error.status >= 500 else None)
            span.set("transcription.error.code", error.code or error.type)
            if not started:  # once a stream has begun, its own error event told the client
                await Reply.error(error).send(send)
        finally:
            ex.uploaded()
            obs.done()
            ticket.close()
            if ex.charge is not None:  # refunded whole unless answered 200
                served = obs.status == 200
                ex.charge.settle((obs.audio_seconds or ex.charge.seconds) if served else None)
            span.set("http.response.status_code", obs.status)
            span.set("transcription.model", obs.model)
            span.set("transcription.pool", obs.pool)


REFERENCES = "request's known speaker references"


def _references(scope: Scope, upload: Upload) -> int:
    """Bytes of a client's known speaker references (up to 4 data URLs of 2-10 s of audio),
    held in memory until its answer: counted in the gateway's memory budget. A diarized
    request's parts hold copies of them only while their request holds the originals."""
    if kind(scope) is not None:
        return 0
    return sum(len(v) for k, v in upload.fields if k in LARGE_FIELDS)


async def _pipeline(ex: Exchange, endpoint: Capability) -> None:
    headers = Request(ex.scope).headers
    caller = ex.identify()
    catalog = ex.gw.router.catalog  # one route table for the whole request, reloads aside
    limit = catalog.max_upload_bytes
    tracer = ex.gw.tracer
    length = headers.get("content-length")
    # Its audio counts for the first pool of the deployment it names, until it is routed.
    if catalog.default is not None:
        ex.ticket.expect(first_pool(ex.gw.router, catalog.default, endpoint))

    def routed(name: str, value: str) -> Limit | None:
        """Step 4 at the form's `model` field, before the parts after it are read."""
        if name != "model":
            return None
        table = catalog.resolve(value, caller)
        ex.obs.model = table.model
        ex.ticket.expect(first_pool(ex.gw.router, table, endpoint))
        return catalog.upload_limit(table)

    with tracer.span("receive") as span:
        check_length(length, limit)
        upload = await parse_upload(Request(ex.scope, ex.receive).stream(),
                                    headers.get("content-type"), limit, routed,
                                    ex.ticket.on_file_head(length))  # fmt: skip
        span.set("transcription.upload.bytes", upload.size)
    with closing(upload), ex.gw.body_budget.hold(_references(ex.scope, upload), REFERENCES):
        ex.obs.upload(upload.size)
        with tracer.span("parse") as span:
            request = parse_request(upload.fields)
            table = catalog.resolve(request.model, caller)
            ex.obs.model = primary = table.model
            audio = check_audio(upload)
            seconds = audio_seconds(audio, upload.size)
            ex.ticket.count(seconds, first_pool(ex.gw.router, table, endpoint))
            ex.charged(seconds)
            span.set("transcription.model", primary)
            span.set("transcription.audio.container", audio.container)
            span.set("transcription.audio.seconds", audio.seconds)
        needs = request_needs(
            endpoint,
            stream=request.stream,
            response_format=request.response_format,
            granularities=request.timestamp_granularities,
            languages=len(request.languages),
            keywords=bool(request.keywords),
            logprobs=request.logprobs,
        )
        settings = ex.gw.settings
        longest = settings.max_audio_seconds
        if longest is not None and (audio.seconds or 0) > longest:
            raise too_long(audio.seconds or 0, longest)
        if request.diarized and endpoint != Capability.DIARIZATION:
            # Who said what: its transcript and its speakers, then joined (diarized.py).
            diarized.check(ex.gw, endpoint, table, upload.size)
            ex.obs.pool = "diarized"
            async with cancel_on_disconnect(ex.receive, ex.answered):
                reply = await diarized.transcribe_diarized(
                    transcribe, ex.gw, ex.scope, upload, request, table, audio.seconds
                )
                ex.obs.status = reply.status
                await reply.send(ex.send)
            ex.obs.audio_seconds = reply.seconds
            return
        if endpoint == Capability.DIARIZATION:  # a diarized request's speakers: the whole file
            await speakers(ex, upload, audio, primary, request, needs, table)
            return
        strategy = plan(settings.chunking, parse_chunking(upload.fields), audio, upload.size,
                        ex.gw.router.candidates(table, needs, upload.size))  # fmt: skip
        if strategy is not None:  # long audio: cut, fanned out, stitched (longaudio/)
            ex.obs.pool = "chunked"
            async with cancel_on_disconnect(ex.receive, ex.answered):
                reply = await transcribe_long(transcribe, ex.gw, endpoint, ex.scope, upload,
                                              request, strategy, needs, table,
                                              ex.ticket)  # fmt: skip
                ex.obs.status = reply.status
                await reply.send(ex.send)
            ex.obs.audio_seconds = reply.seconds
            return
        with tracer.span("route", {"transcription.needs": sorted(c.value for c in needs)}) as span:
            pools = choose_pools(ex.gw.router, table, needs, upload.size)
            adapters = able(
                [adapter(p) for p in pools], lambda a: a.transcription_refusal(upload.fields, audio)
            )
            span.set("transcription.pools", [a.pool.name for a in adapters])
        await ex.forward(
            adapters,
            lambda a: a.transcription_request(endpoint, upload, audio, primary, request),
            upload,
            request.stream,
            lambda a, answer: a.transcription_reply(answer, request, audio),
        )


async def speakers(
    ex: Exchange, upload: Upload, audio: AudioInfo, primary: str, request: TranscriptionRequest,
    needs: frozenset[Capability], table: RouteTable,
) -> None:  # fmt: skip
    """A diarized request's speakers (`diarized.py`), from a pool that runs the speaker
    stage: its worker's answer (SpeakerTurns) as it is."""
    pools = choose_pools(ex.gw.router, table, needs, upload.size)

    async def reply(a: Adapter, answer: WorkerAnswer) -> Reply:
        if answer.status != 200:
            raise await a.error(answer)
        return Reply(200, "application/json", await answer.read())

    await ex.forward(
        [adapter(p) for p in pools],
        lambda a: a.transcription_request(Capability.DIARIZATION, upload, audio, primary, request),
        upload,
        False,
        reply,
    )


def first_pool(router: Router, table: RouteTable, endpoint: Capability) -> str | None:
    """The pool of `table` a plain request to `endpoint` goes to first, if any."""
    pools = router.candidates(table, frozenset({endpoint}), 0)
    return None if isinstance(pools, NoPool) else pools[0].name


def choose_pools(
    router: Router, table: RouteTable, needs: frozenset[Capability], size: int
) -> list[PoolRoute]:
    """The pools of `table` to try, in order; 400 naming what no pool has, 413 if none takes
    the size."""
    pools = router.candidates(table, needs, size)
    if not isinstance(pools, NoPool):
        return pools
    if pools.too_large_for:
        limits = ", ".join(
            f"{p.name}: {(p.capability_set.max_upload_bytes or 0) / 1024**2:g} MiB"
            for p in pools.too_large_for
        )
        raise APIError(
            413,
            f"File too large for the pools that can serve this request (their engines' upload "
            f"limits: {limits}). Split or compress the audio.",
            param="file",
        )
    which = f"deployment {table.deployment}" if table.deployment else "this deployment"
    raise bad_request(
        f"no pool of {which} can serve this request: missing capability "
        + ", ".join(sorted(pools.missing)),
        code="unsupported_capability",
    )

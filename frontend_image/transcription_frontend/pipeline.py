"""The request pipeline of `POST /v1/audio/{transcriptions,translations}`, top to bottom.

  1. key        the API key, if keys are configured                       (auth.py)
  2. upload     the multipart body, streamed and spooled, within the limit (multipart)
  3. request    the form's options, validated into one typed model        (params)
  4. model      the name or alias, resolved to the primary model
  5. audio      an empty or non-audio file is refused here; its container (sniff.py)
                and duration are read from its header
  6. needs      what the request needs from a pool                        (capabilities)
  7. pools      the pools that cover the needs, continuous first,         (routing.py)
                whose engines take its fields, container and duration     (engines.py)
  8. forward    to a worker, retried elsewhere if it cannot take it, held  (forward.py,
                while its pools have none (scale from zero); an audio        hold.py)
                language model's pool is asked through its chat endpoint   (engines.py)
  9. respond    the answer rendered or streamed to the client             (respond.py)

Steps 8 and 9 run inside one `async with` that releases the worker connection when the
response has been sent, and inside a watch that cancels both if the client disconnects.
One `Observation` records the request's metrics once, when it has ended (`run`, which the
chat endpoint's pipeline, `chat.py`, runs in too).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import closing

from starlette.requests import Request
from starlette.types import Message, Receive, Scope, Send

from transcription_api.capabilities import Capability, request_needs
from transcription_api.engines import Asked
from transcription_api.errors import APIError, bad_request
from transcription_api.multipart import check_length, parse_upload
from transcription_api.params import parse_request
from transcription_api.routes import PoolRoute, RouteTable

from .disconnect import cancel_on_disconnect
from .engines import CHAT_PATH, able, chat_transcription, engine_fields, transcription_refusal
from .errors import internal_error
from .forward import JsonBody, MultipartBody
from .gateway import Gateway
from .metrics import Observation
from .request_id import request_id
from .respond import Reply, shape
from .routing import NoPool, Router
from .sniff import check_audio
from .streams import Translation


async def transcribe(
    gw: Gateway, endpoint: Capability, scope: Scope, receive: Receive, send: Send
) -> None:
    await run(endpoint.value, send, lambda send_, answered, obs: _pipeline(
        gw, endpoint, scope, receive, send_, answered, obs))  # fmt: skip


# A pipeline, given the tracked `send`, whether the response has been sent whole, and the
# request's Observation.
Work = Callable[[Send, Callable[[], bool], Observation], Awaitable[None]]


async def run(endpoint: str, send: Send, work: Work) -> None:
    """Run a pipeline; answer its APIError (or a bug) in OpenAI's shape; record metrics."""
    obs = Observation(endpoint)
    started = answered = False

    async def send_tracked(message: Message) -> None:
        nonlocal started, answered
        started = started or message["type"] == "http.response.start"
        answered = message["type"] == "http.response.body" and not message.get("more_body")
        await send(message)

    try:
        try:
            await work(send_tracked, lambda: answered, obs)
        except APIError as e:
            error = e
        except Exception as e:
            error = internal_error(e)  # a bug: logged, and still answered in OpenAI's shape
        else:
            return
        obs.status = error.status
        if not started:  # once a stream has begun, its own error event told the client
            await Reply.error(error).send(send)
    finally:
        obs.done()


async def _pipeline(
    gw: Gateway, endpoint: Capability, scope: Scope, receive: Receive, send: Send,
    answered: Callable[[], bool], obs: Observation,
) -> None:  # fmt: skip
    headers = Request(scope).headers
    gw.keys.check(headers.get("authorization"))
    table = gw.router.table
    limit = table.max_upload_bytes
    check_length(headers.get("content-length"), limit)
    upload = await parse_upload(
        Request(scope, receive).stream(), headers.get("content-type"), limit
    )
    with closing(upload):
        obs.upload(upload.size)
        request = parse_request(upload.fields)
        obs.model = primary = resolve_model(table, request.model)
        audio = check_audio(upload)
        needs = request_needs(
            endpoint,
            stream=request.stream,
            response_format=request.response_format,
            granularities=request.timestamp_granularities,
        )
        pools = choose_pools(gw.router, needs, upload.size)
        pools = able(pools, transcription_refusal(upload.fields, audio))

        chat: dict[str, bytes] = {}  # per pool, once: retries resend the same bytes

        def request_for(pool: PoolRoute) -> tuple[str, MultipartBody | JsonBody]:
            if pool.serving.asked != Asked.CHAT:
                fields = engine_fields(upload.fields, pool, primary, request)
                return f"/v1/audio/{endpoint.value}", MultipartBody(fields, upload)
            if pool.name not in chat:
                chat[pool.name] = chat_transcription(
                    upload.read_all(), audio.container, pool, primary, request
                )
            return CHAT_PATH, JsonBody(chat[pool.name])

        async with (
            cancel_on_disconnect(receive, answered),
            gw.forwarder.send(
                pools, request_for, upload, request_id(scope), stream=request.stream
            ) as answer,
        ):
            obs.pool = answer.pool.name
            reply = await shape(answer, request)
            obs.status = reply.status
            await reply.send(send)
            if isinstance(reply.stream, Translation) and reply.stream.error:
                obs.status = reply.stream.error.status


def resolve_model(table: RouteTable, name: str | None) -> str:
    """The primary model a requested name (or alias) stands for; 404 if none."""
    primary = table.resolve(name)
    if primary is None:
        valid = ", ".join(table.served_names)
        raise APIError(
            404, f"The model `{name}` does not exist. Valid models: {valid}", param="model"
        )
    return primary


def choose_pools(router: Router, needs: frozenset[Capability], size: int) -> list[PoolRoute]:
    """The pools to try, in order; 400 naming what no pool has, 413 if none takes the size."""
    pools = router.candidates(needs, size)
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
    raise bad_request(
        "no pool of this deployment can serve this request: missing capability "
        + ", ".join(sorted(pools.missing)),
        code="unsupported_capability",
    )

"""The pipeline of `POST /v1/chat/completions`, top to bottom.

  1. key        the API key, if keys are configured, and its tenant       (auth.py,
                                                                          tenants.py)
  2. body       refused unread if no pool can chat (400); else the JSON body, spooled
                as it arrives within the upload limit (413), then parsed
                whole within the memory budget for bodies (503)     (limits.py)
  3. request    validated into one typed model; URLs refused              (api chat.py)
  4. model      the name or alias, resolved to its deployment's route     (catalog.py)
                table and primary model; the body within that deployment's
                upload limit (413)
  5. audio      each input_audio part's container, from its first bytes  (sniff.py)
                and length: what the tenant's quota is charged            (quota.py)
  6. needs      chat, and stream if asked                                 (capabilities)
  7. pools      the deployment's pools that cover the needs, continuous   (routing.py)
                first, whose engines take its fields and audio            (adapters/)
  8. forward    the JSON body with `model` rewritten for the pool, encoded (forward.py)
                as it is sent (no second copy)
  9. respond    the answer with `model` back to the primary name; a stream passed
                through event by event as it arrives, ending with     (adapters/, streams.py)
                `data: [DONE]`

As for the audio endpoints (`pipeline.run`, `Exchange.forward`): errors in OpenAI's shape,
metrics (endpoint `chat`), the quota's charge and headers, the fair order while its pool
is busy, cancellation of the worker request when the client disconnects, request ids.
"""

from __future__ import annotations

import io
import json
import tempfile
from collections.abc import AsyncIterator
from contextlib import closing
from typing import IO, Any

from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from transcription_api.capabilities import Capability, request_needs
from transcription_api.chat import ChatCompletionRequest, InputAudio, not_json, parse_chat
from transcription_api.errors import APIError, bad_request
from transcription_api.multipart import SPOOL_BYTES

from .adapters import CHAT_PATH, able, adapter
from .forward import JsonBody
from .gateway import Gateway
from .inline import Base64Reader
from .pipeline import Exchange, choose_pools, run
from .routing import NoPool
from .sniff import AudioInfo, audio_seconds, probe
from .tenants import Caller

PATH = CHAT_PATH


async def complete(gw: Gateway, scope: Scope, receive: Receive, send: Send) -> None:
    await run(gw, Capability.CHAT.value, scope, receive, send, _pipeline)


async def _pipeline(ex: Exchange) -> None:
    headers = Request(ex.scope).headers
    caller = ex.identify()
    catalog = ex.gw.router.catalog
    # No pool can chat: refused before a byte of the body is read (it can be tens of MB).
    chat = frozenset({Capability.CHAT})
    if catalog.tables and all(
        isinstance(ex.gw.router.candidates(t, chat, 0), NoPool) for t in catalog.tables
    ):
        if catalog.default is not None:
            choose_pools(ex.gw.router, catalog.default, chat, 0)  # 400 naming what it lacks
        raise bad_request(
            "no deployment this gateway routes can serve chat completions: missing capability chat",
            code="unsupported_capability",
        )
    limit = catalog.max_upload_bytes
    length = headers.get("content-length")
    if length and length.isdigit() and int(length) > limit:
        raise body_too_large(limit)
    with ex.gw.tracer.span("receive") as span:
        spool, size = await spool_body(Request(ex.scope, ex.receive).stream(), limit)
        span.set("transcription.upload.bytes", size)
    ex.obs.upload(size)
    # Parsed whole, it is held in memory until the answer has been sent: within the budget.
    with ex.gw.body_budget.hold(size, "chat completion body"):
        with closing(spool):
            request, body = parse_chat(text_of(spool))
        await _route_and_forward(ex, caller, request, body, size)


async def _route_and_forward(
    ex: Exchange, caller: Caller, request: ChatCompletionRequest, body: dict[str, Any],
    size: int,
) -> None:  # fmt: skip
    """Steps 4 to 9, for a body that has arrived and been parsed."""
    table = ex.gw.router.catalog.resolve(request.model, caller)
    ex.obs.model = primary = table.model
    if size > table.max_upload_bytes:
        raise body_too_large(table.max_upload_bytes, table.deployment)
    audio = []
    seconds = 0.0  # of all its audio parts, for autoscaling
    for i, j, part in request.audio_parts():
        param = f"messages[{i}].content[{j}].input_audio"
        info = sniff(part, param)
        # The container the bytes are in, not the one the client named: the worker
        # trusts `format` (transformers picks its decoder from it).
        body["messages"][i]["content"][j]["input_audio"]["format"] = info.container
        audio.append((param, info))
        seconds += audio_seconds(info, len(part.data) * 3 // 4)  # base64: 4 characters, 3 bytes
    needs = request_needs(Capability.CHAT, stream=request.stream)
    traced = {"transcription.needs": sorted(c.value for c in needs)}
    with ex.gw.tracer.span("route", traced) as span:
        pools = choose_pools(ex.gw.router, table, needs, size)
        adapters = able([adapter(p) for p in pools], lambda a: a.chat_refusal(body, audio))
        span.set("transcription.pools", [a.pool.name for a in adapters])
    ex.ticket.count(seconds, pools[0].name)
    ex.charged(seconds)
    await ex.forward(
        adapters,
        lambda a: a.chat_request(body, primary),
        JsonBody(body, size),
        request.stream,
        lambda a, answer: a.chat_reply(answer, primary, request.stream),
    )


def body_too_large(limit: int, deployment: str | None = None) -> APIError:
    mib = limit / 1024**2
    whose = f" of deployment {deployment}" if deployment else ""
    return APIError(
        413,
        f"Request too large: the limit{whose} is {limit} bytes ({mib:.1f} MiB) for the whole "
        f"JSON body. Audio sent inline as base64 takes about 4/3 of its file size, so about "
        f"{mib * 3 / 4:.1f} MiB of audio fits: compress it (e.g. to mp3 or opus) or send a "
        "shorter clip.",
        param="messages",
        code="request_too_large",
    )


async def spool_body(stream: AsyncIterator[bytes], limit: int) -> tuple[IO[bytes], int]:
    """The whole body, spooled as it arrives (memory up to 1 MiB, then disk, as uploads are:
    a slow client holds no memory), and its size; refused (413) as soon as it passes the
    limit."""
    spool = tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES)  # noqa: SIM115
    size = 0
    try:
        async for chunk in stream:
            size += len(chunk)
            if size > limit:
                raise body_too_large(limit)
            spool.write(chunk)
    except BaseException:
        spool.close()
        raise
    spool.seek(0)
    return spool, size


def text_of(spool: IO[bytes]) -> str:
    """The spooled JSON body as text, in the encoding JSON's decoder would detect: the bytes
    are let go as soon as they are decoded, so parsing holds two copies, not three."""
    raw = spool.read()
    try:
        return raw.decode(json.detect_encoding(raw), "surrogatepass")
    except UnicodeDecodeError as e:  # as JSON's decoder would have refused it
        raise not_json(e) from None


def sniff(part: InputAudio, param: str) -> AudioInfo:
    """An audio part's container and duration (its data is valid base64: the chat
    contract, transcription_api/chat.py, checked it)."""
    data = Base64Reader(part.data)  # decoded only where the probe reads
    try:
        return probe(io.BufferedReader(data), data.size)
    except APIError as e:
        raise bad_request(
            "the audio is not a recognised audio container (wav, mp3, flac, ogg ...)",
            param=f"{param}.data",
            code="invalid_audio",
        ) from e

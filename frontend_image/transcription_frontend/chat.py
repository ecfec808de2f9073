"""The pipeline of `POST /v1/chat/completions`, top to bottom.

  1. key        the API key, if keys are configured                       (auth.py)
  2. body       the JSON body, read within the upload limit (413)
  3. request    validated into one typed model; URLs refused              (api chat.py)
  4. model      the name or alias, resolved to the primary model
  5. audio      each input_audio part's container, from its first bytes  (sniff.py)
  6. needs      chat, and stream if asked                                 (capabilities)
  7. pools      the pools that cover the needs, continuous first,         (routing.py)
                whose engines take its fields and audio                   (engines.py)
  8. forward    the JSON body with `model` rewritten for the pool         (forward.py)
  9. respond    the answer with `model` back to the primary name; a stream passed
                through event by event as it arrives, ending with `data: [DONE]`

As for the audio endpoints (`pipeline.run`): errors in OpenAI's shape, metrics (endpoint
`chat`), cancellation of the worker request when the client disconnects, request ids.
"""

from __future__ import annotations

import base64
import io
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from transcription_api import sse
from transcription_api.capabilities import Capability, request_needs
from transcription_api.chat import InputAudio, parse_chat
from transcription_api.errors import APIError, bad_request
from transcription_api.routes import PoolRoute

from .disconnect import cancel_on_disconnect
from .engines import CHAT_PATH, able, chat_body, chat_refusal
from .forward import JsonBody, WorkerAnswer
from .gateway import Gateway
from .metrics import Observation
from .pipeline import choose_pools, resolve_model, run
from .request_id import request_id
from .respond import Reply, worker_error
from .sniff import AudioInfo, probe
from .streams import STREAM_ERRORS, stream_failed, worker_failed

PATH = CHAT_PATH


async def complete(gw: Gateway, scope: Scope, receive: Receive, send: Send) -> None:
    await run(Capability.CHAT.value, send, lambda send_, answered, obs: _pipeline(
        gw, scope, receive, send_, answered, obs))  # fmt: skip


async def _pipeline(
    gw: Gateway, scope: Scope, receive: Receive, send: Send, answered: Callable[[], bool],
    obs: Observation,
) -> None:  # fmt: skip
    headers = Request(scope).headers
    gw.keys.check(headers.get("authorization"))
    table = gw.router.table
    limit = table.max_upload_bytes
    length = headers.get("content-length")
    if length and length.isdigit() and int(length) > limit:
        raise body_too_large(limit)
    raw = await read_body(Request(scope, receive).stream(), limit)
    obs.upload(len(raw))
    request, body = parse_chat(raw)
    obs.model = primary = resolve_model(table, request.model)
    audio = []
    for i, j, part in request.audio_parts():
        param = f"messages[{i}].content[{j}].input_audio"
        info = sniff(part, param)
        # The container the bytes are in, not the one the client named: the worker
        # trusts `format` (transformers picks its decoder from it).
        body["messages"][i]["content"][j]["input_audio"]["format"] = info.container
        audio.append((param, info))
    needs = request_needs(Capability.CHAT, stream=request.stream)
    pools = able(choose_pools(gw.router, needs, len(raw)), chat_refusal(body, audio))

    encoded: dict[str, bytes] = {}  # per pool, once: retries resend the same bytes

    def request_for(pool: PoolRoute) -> tuple[str, JsonBody]:
        if pool.name not in encoded:
            encoded[pool.name] = chat_body(body, pool, primary)
        return PATH, JsonBody(encoded[pool.name])

    async with (
        cancel_on_disconnect(receive, answered),
        gw.forwarder.send(
            pools, request_for, JsonBody(raw), request_id(scope), stream=request.stream
        ) as answer,
    ):
        obs.pool = answer.pool.name
        reply = await shape(answer, primary, request.stream)
        obs.status = reply.status
        await reply.send(send)
        if isinstance(reply.stream, ChatStream) and reply.stream.error:
            obs.status = reply.stream.error.status


def body_too_large(limit: int) -> APIError:
    mib = limit / 1024**2
    return APIError(
        413,
        f"Request too large: the limit is {limit} bytes ({mib:.1f} MiB) for the whole JSON "
        f"body. Audio sent inline as base64 takes about 4/3 of its file size, so about "
        f"{mib * 3 / 4:.1f} MiB of audio fits: compress it (e.g. to mp3 or opus) or send a "
        "shorter clip.",
        param="messages",
        code="request_too_large",
    )


async def read_body(stream: AsyncIterator[bytes], limit: int) -> bytes:
    """The whole body, refused (413) as soon as it passes the limit."""
    parts: list[bytes] = []
    size = 0
    async for chunk in stream:
        size += len(chunk)
        if size > limit:
            raise body_too_large(limit)
        parts.append(chunk)
    return b"".join(parts)


def sniff(part: InputAudio, param: str) -> AudioInfo:
    """An audio part's container and duration (its data is valid base64: api/chat.py)."""
    data = base64.b64decode(part.data)
    try:
        return probe(io.BytesIO(data), len(data))
    except APIError as e:
        raise bad_request(
            "the audio is not a recognised audio container (wav, mp3, flac, ogg ...)",
            param=f"{param}.data",
            code="invalid_audio",
        ) from e


# --------------------------------------------------------------------------- respond


async def shape(answer: WorkerAnswer, primary: str, stream: bool) -> Reply:
    """The client's reply to a worker's answer (raises APIError for a failed one)."""
    if answer.status != 200:
        raise await worker_error(answer)
    if stream:
        return Reply(200, sse.MEDIA_TYPE, stream=ChatStream(answer, primary),
                     headers=sse.HEADERS)  # fmt: skip
    raw = await answer.read()
    try:
        doc = json.loads(raw)
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        raise worker_failed(answer.pool, "it sent no JSON object")
    if (err := sse.error_in(doc)) is not None:
        raise worker_failed(answer.pool, err.message)
    doc["model"] = primary
    return Reply(200, "application/json", _dumps(doc))


class ChatStream:
    """A worker's chat stream as the client gets it, event by event: `model` rewritten to
    the primary name, engine errors in OpenAI's shape, and `data: [DONE]` last (transformers
    serve does not send it). `error` is set if the stream failed: it ended before a choice
    finished, broke off, or the engine reported an error."""

    def __init__(self, answer: WorkerAnswer, primary: str) -> None:
        self.answer = answer
        self.primary = primary
        self.error: APIError | None = None

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for event in self._events():
                yield event
        except STREAM_ERRORS as e:
            self.error = stream_failed(self.answer.pool, e)
        if self.error is not None:
            yield sse.encode(self.error.event())
        yield sse.DONE

    async def _events(self) -> AsyncIterator[bytes]:
        finished = False
        async for payload in sse.payloads(self.answer.chunks()):
            if payload.strip() == "[DONE]":
                return
            try:
                doc = json.loads(payload)
                err = sse.error_in(doc)
            except ValueError:
                doc, err = None, sse.engine_error(payload)  # transformers' unescaped error
                if err is None:
                    continue  # not an event
            if err is not None:
                self.error = worker_failed(self.answer.pool, f"mid-stream: {err.message}")
                return
            if isinstance(doc, dict):
                if "model" in doc:
                    doc["model"] = self.primary
                choices = doc.get("choices") or []
                finished = finished or any(
                    isinstance(c, dict) and c.get("finish_reason") for c in choices
                )
            yield b"data: " + _dumps(doc) + b"\n\n"
        if not finished:
            self.error = worker_failed(self.answer.pool, "its stream ended before the answer did")


def _dumps(doc: Any) -> bytes:
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode()

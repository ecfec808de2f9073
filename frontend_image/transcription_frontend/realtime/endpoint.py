"""`GET /v1/realtime?intent=transcription`: OpenAI's Realtime API in transcription mode, a
WebSocket on the gateway's own port.

Before the upgrade: the intent, the API key (one `Authorization: Bearer` header, as on
HTTP, or the `openai-insecure-api-key.<key>` subprotocol browsers send) and its tenant (a
quota of 0: 429), the model in the query if any, and the replica's session limit. A
refusal is an HTTP answer in OpenAI's error shape (401, 403, 404, 400, 429, 503 with
`Retry-After`), which the SDK raises as it does for HTTP. Each turn is charged to the
tenant's quota as it is transcribed (turns.py).

After it: one Session (session.py), fed one client event at a time. A bad event gets an
`error` event naming the field, and the session lives on. The session ends when the client
closes, when it has sent nothing for `realtime_idle_timeout_seconds`, when it has lasted
`realtime_session_seconds` (the frontend's limits), or when the replica drains (close code
1001, "going away", which the SDK reconnects from, after the turns being transcribed have
ended).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import TYPE_CHECKING
from urllib.parse import parse_qs

from pydantic import BaseModel
from starlette.types import Receive, Scope, Send
from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from transcription_api.errors import APIError
from transcription_api.realtime import ErrorBody, ErrorEvent, EventError, parse_client_event

from .. import auth, metrics
from ..gateway import Gateway
from .sessions import Sessions

if TYPE_CHECKING:
    from .session import Session

log = logging.getLogger("transcription_frontend.realtime")

KEY_PROTOCOL = "openai-insecure-api-key."
GOING_AWAY = 1001


async def serve(
    gw: Gateway, sessions: Sessions, scope: Scope, receive: Receive, send: Send
) -> None:
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    protocols: list[str] = list(scope.get("subprotocols") or [])
    error: APIError | None
    try:
        header = _credentials(scope["headers"], protocols)
    except APIError as e:  # several Authorization headers
        header, reason, error = None, "key", e
    else:
        reason, error = _check(gw, sessions, query, header)
    if error is not None:
        metrics.REALTIME_REFUSED.labels(reason=reason).inc()
        await refuse(scope, send, error)
        return
    # session.py (PyAV, numpy, Silero in onnxruntime: 57 MB) is loaded by the first session
    from .session import Session

    ws = WebSocket(scope, receive, send)
    # A browser offers `realtime` with its key's subprotocol; the answer must pick one.
    await ws.accept(subprotocol="realtime" if "realtime" in protocols else None)
    lock = asyncio.Lock()

    async def emit(event: BaseModel) -> None:
        async with lock:
            if ws.client_state == WebSocketState.CONNECTED:
                await ws.send_text(event.model_dump_json())

    rid = dict(scope["headers"]).get(b"x-request-id", b"").decode("latin-1")[:128]
    session = Session(
        gw, emit, authorization=header, client=scope.get("client"),
        request_id=rid or uuid.uuid4().hex, model=(query.get("model") or [None])[0],
        trace=gw.tracer.incoming(scope["headers"]),
    )  # fmt: skip
    sessions.use(session, session.pool())
    metrics.REALTIME_SESSIONS.set(len(sessions.open))
    code = 1000
    try:
        await session.start()
        code = await _read(ws, session, sessions)
    except WebSocketDisconnect:
        code = 0
    finally:
        sessions.close(session)
        metrics.REALTIME_SESSIONS.set(len(sessions.open))
        await session.close()
        if code and ws.client_state == WebSocketState.CONNECTED:
            async with lock:
                await ws.close(code)


def _credentials(headers: list[tuple[bytes, bytes]], protocols: list[str]) -> bytes | None:
    """The upgrade's key: its `Authorization` header (one at most: HTTP's rule), or the
    subprotocol browsers send it in."""
    header = auth.authorization(headers)
    for p in protocols:
        if p.startswith(KEY_PROTOCOL):
            header = "Bearer " + p[len(KEY_PROTOCOL) :]
    return header.encode("latin-1") if header is not None else None


def _check(
    gw: Gateway, sessions: Sessions, query: dict[str, list[str]], header: bytes | None
) -> tuple[str, APIError | None]:
    if query.get("intent") != ["transcription"]:
        return "intent", APIError(
            400, "This gateway serves realtime transcription sessions only: connect to "
            "/v1/realtime?intent=transcription.", param="intent", code="unsupported_intent",
        )  # fmt: skip
    try:
        caller = gw.caller(header.decode("latin-1") if header else None)
        gw.quotas.check_open(caller.tenant)
        gw.router.catalog.check_session(query["model"][0] if query.get("model") else None, caller)
    except APIError as e:
        return ("model" if e.param == "model" else "quota" if e.status == 429 else "key"), e
    return sessions.admit()


async def refuse(scope: Scope, send: Send, error: APIError) -> None:
    """An HTTP answer instead of the upgrade (ASGI's websocket.http.response extension),
    else a close before it (403)."""
    if "websocket.http.response" in scope.get("extensions", {}):
        extra = [(k.lower().encode(), v.encode()) for k, v in error.headers.items()]
        headers = [(b"content-type", b"application/json"), *extra]
        await send({"type": "websocket.http.response.start", "status": error.status,
                    "headers": headers})  # fmt: skip
        await send({"type": "websocket.http.response.body", "body": error.body()})
    else:
        await send({"type": "websocket.close", "code": 1008, "reason": error.message[:120]})


async def _read(ws: WebSocket, session: Session, sessions: Sessions) -> int:
    """Client events until the session ends; the close code to send (0: the client left)."""
    limits = sessions.limits
    ends = time.monotonic() + limits.realtime_session_seconds
    while True:
        wait = min(limits.realtime_idle_timeout_seconds, ends - time.monotonic())
        receive = asyncio.ensure_future(ws.receive())
        closing = asyncio.ensure_future(sessions.closing.wait())
        done, _ = await asyncio.wait({receive, closing}, timeout=max(wait, 0),
                                     return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
        closing.cancel()
        if receive not in done:
            receive.cancel()
            if closing in done:
                await session.finish(sessions.grace)
                return GOING_AWAY
            expired = time.monotonic() >= ends
            why = (
                f"Your session hit its maximum duration of {limits.realtime_session_seconds:g} s."
                if expired
                else "No event from the client for "
                f"{limits.realtime_idle_timeout_seconds:g} s: the session ends."
            )
            code = "session_expired" if expired else "session_idle_timeout"
            await session.emit(ErrorEvent(error=ErrorBody(message=why, code=code)))
            await session.finish(5)
            return 1000
        message = receive.result()
        if message["type"] == "websocket.disconnect":
            return 0
        text = message.get("text")
        if text is None:
            text = (message.get("bytes") or b"").decode("utf-8", "replace")
        try:
            await session.handle(parse_client_event(text))
        except EventError as e:
            await session.emit(ErrorEvent.of(e))

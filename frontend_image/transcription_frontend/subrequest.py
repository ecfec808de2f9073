"""A request the gateway sends itself, into its own pipeline.

A realtime turn and a long file's chunk are each transcribed as the request an HTTP client
would send: a multipart form into `pipeline.transcribe`, with the client's key. So they get
the same key check, alias resolution, capability routing, engine adapters, retries on
another worker, holds while a pool scales from zero, and metrics as any request, and count
as load for autoscaling. The response is read as it is written: a stream's events one by
one (`on_event`), else the whole body.

Cancelling the call cancels the request (and with it the worker's): its "client" never
disconnects on its own.

A subrequest sent with `background` (a long file's chunk; a realtime turn is not: someone
waits for it) is forwarded with `PRIORITY_HEADER: background`, so that a worker serves
interactive requests before it. The mark rides in the request's ASGI `state`, which only
the gateway itself writes: no header a client sends can set it.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.types import Message, Receive, Scope, Send

from transcription_api.capabilities import Capability

from .gateway import Gateway

# The key in a subrequest's ASGI `state` that marks it background work (`background`).
BACKGROUND_STATE = "transcription.background"

OnEvent = Callable[[dict[str, Any]], Awaitable[None]]
# The pipeline's entry (pipeline.transcribe), passed in: the pipeline itself sends
# subrequests (long audio's chunks), so this module cannot import it.
Pipeline = Callable[[Gateway, Capability, Scope, Receive, Send], Awaitable[None]]


def background(scope: Scope) -> bool:
    """Whether this request is the gateway's own background work (a subrequest sent with
    `background`); a client's request never is."""
    return scope.get("state", {}).get(BACKGROUND_STATE) is True


@dataclass(frozen=True)
class Caller:
    """Who the subrequests are for: the client's key, address and request id."""

    authorization: bytes | None = None
    client: tuple[str, int] | None = None
    request_id: str = ""


def form(fields: list[tuple[str, str]], file: bytes, filename: str, content_type: str
         ) -> tuple[bytes, str]:  # fmt: skip
    """A multipart form (fields in order, then the file) and its content type."""
    boundary = uuid.uuid4().hex
    parts = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode()
        for name, value in fields
    ]
    parts.append(
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{filename}"\r\n'
        f"Content-Type: {content_type}\r\n\r\n".encode()
        + file
        + b"\r\n"
    )
    parts.append(f"--{boundary}--\r\n".encode())
    return b"".join(parts), f"multipart/form-data; boundary={boundary}"


@dataclass
class _Reader:
    on_event: OnEvent | None
    status: int = 0
    streaming: bool = False
    buffer: bytes = b""
    body: bytearray = field(default_factory=bytearray)

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
            ctype = dict(message.get("headers") or []).get(b"content-type", b"")
            self.streaming = ctype.startswith(b"text/event-stream") and self.on_event is not None
            return
        if message["type"] != "http.response.body":
            return
        chunk = message.get("body", b"")
        if not self.streaming:
            self.body += chunk
            return
        assert self.on_event is not None
        self.buffer += chunk
        while b"\n\n" in self.buffer:
            event, self.buffer = self.buffer.split(b"\n\n", 1)
            for line in event.split(b"\n"):
                data = line[5:].strip() if line.startswith(b"data:") else b""
                if data and data != b"[DONE]":
                    await self.on_event(json.loads(data))


async def post(
    pipeline: Pipeline, gw: Gateway, endpoint: Capability, fields: list[tuple[str, str]],
    file: bytes, filename: str, content_type: str, caller: Caller,
    on_event: OnEvent | None = None, background: bool = False,
) -> tuple[int, bytes]:  # fmt: skip
    """Send one request into the pipeline: (status, body). A streamed answer's events go to
    `on_event` as they are written (its body is then empty). `background`: the worker is
    told it is background work."""
    body, ctype = form(fields, file, filename, content_type)
    headers = [
        (b"content-type", ctype.encode()),
        (b"content-length", str(len(body)).encode()),
        *([(b"authorization", caller.authorization)] if caller.authorization else []),
    ]
    path = "/v1/audio/" + endpoint.value
    scope: Scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
        "root_path": "", "headers": headers, "client": caller.client, "server": None,
        "state": {"request_id": caller.request_id, BACKGROUND_STATE: background},
    }  # fmt: skip
    sent = False
    never = asyncio.Event()

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await never.wait()
        return {"type": "http.disconnect"}

    reader = _Reader(on_event)
    await pipeline(gw, endpoint, scope, receive, reader.send)
    return reader.status, bytes(reader.body)

"""A request the gateway sends itself, into its own pipeline.

A realtime turn and a long file's chunk are each transcribed as the request an HTTP client
would send: a multipart form into `pipeline.transcribe`, with the client's key. So they get
the same key check, alias resolution, capability routing, engine adapters, retries on
another worker, holds while a pool scales from zero, and metrics as any request, and count
as load for autoscaling. The response is read as it is written: a stream's events one by
one (`on_event`), else the whole body.

Cancelling the call cancels the request (and with it the worker's): its "client" never
disconnects on its own.

Each says which it is (`CHUNK`, `TURN` or `PART`) in the request's ASGI `state`, which only the
gateway itself writes: no header a client sends can set it. A long file's chunk is
background work: forwarded with `PRIORITY_HEADER: background`, so that a worker serves
interactive requests before it, and not charged to its tenant's quota, which its file was
charged whole (quota.py). A realtime turn is interactive, whatever its tenant's class
(someone is listening), and charged to its session's tenant. A diarized request's two
parts (`PART`: its transcript, and its speakers from a pool that runs the speaker stage) are
interactive and not charged: their request was.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any

from starlette.types import Message, Receive, Scope, Send

from transcription_api.capabilities import Capability

from .gateway import Gateway

# The key in a subrequest's ASGI `state` that says which subrequest it is.
KIND_STATE = "transcription.subrequest"
CHUNK = "chunk"  # a long file's chunk
TURN = "turn"  # a realtime session's turn
PART = "part"  # a diarized request's transcript, or its speakers
PIECE = 1024 * 1024  # a file is read this much at a time

OnEvent = Callable[[dict[str, Any]], Awaitable[None]]
# The pipeline's entry (pipeline.transcribe), passed in: the pipeline itself sends
# subrequests (long audio's chunks), so this module cannot import it.
Pipeline = Callable[[Gateway, Capability, Scope, Receive, Send], Awaitable[None]]


def kind(scope: Scope) -> str | None:
    """Which subrequest this request is (`CHUNK`, `TURN`); None: a client's own."""
    value = scope.get("state", {}).get(KIND_STATE)
    return value if isinstance(value, str) else None


def background(scope: Scope) -> bool:
    """Whether this request is the gateway's own background work (a long file's chunk); a
    client's request never is."""
    return kind(scope) == CHUNK


@dataclass(frozen=True)
class Caller:
    """Who the subrequests are for: the client's key, address and request id."""

    authorization: bytes | None = None
    client: tuple[str, int] | None = None
    request_id: str = ""


def form(fields: list[tuple[str, str]], file: bytes, filename: str, content_type: str
         ) -> tuple[bytes, str]:  # fmt: skip
    """A multipart form (fields in order, then the file) and its content type."""
    head, tail, ctype = _around(fields, filename, content_type)
    return head + file + tail, ctype


def _around(fields: list[tuple[str, str]], filename: str, content_type: str
            ) -> tuple[bytes, bytes, str]:  # fmt: skip
    """What comes before a multipart form's file (its fields, the file's headers) and after
    it, and the form's content type."""
    boundary = uuid.uuid4().hex
    parts = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode()
        for name, value in fields
    ]
    parts.append(
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{filename}"\r\n'
        f"Content-Type: {content_type}\r\n\r\n".encode()
    )
    tail = f"\r\n--{boundary}--\r\n".encode()
    return b"".join(parts), tail, f"multipart/form-data; boundary={boundary}"


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
    file: bytes | IO[bytes], filename: str, content_type: str, caller: Caller, kind: str,
    on_event: OnEvent | None = None,
) -> tuple[int, bytes]:  # fmt: skip
    """Send one request into the pipeline, as `kind` (`CHUNK`, `TURN`, `PART`): (status,
    body). `file` is the audio's bytes, or a file read from its start in pieces as the
    pipeline takes them (several requests may read one file at once). A streamed answer's
    events go to `on_event` as they are written (its body is then empty)."""
    head, tail, ctype = _around(fields, filename, content_type)
    if isinstance(file, bytes):
        head, tail, size, source = head + file + tail, b"", 0, None
    else:
        size, source = file.seek(0, 2), file
    headers = [
        (b"content-type", ctype.encode()),
        (b"content-length", str(len(head) + size + len(tail)).encode()),
        *([(b"authorization", caller.authorization)] if caller.authorization else []),
    ]
    path = "/v1/audio/" + endpoint.value
    scope: Scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
        "root_path": "", "headers": headers, "client": caller.client, "server": None,
        "state": {"request_id": caller.request_id, KIND_STATE: kind},
    }  # fmt: skip
    pieces = _pieces(head, source, size, tail)
    never = asyncio.Event()

    async def receive() -> Message:
        piece = next(pieces, None)
        if piece is not None:
            more = piece[1]
            return {"type": "http.request", "body": piece[0], "more_body": more}
        await never.wait()
        return {"type": "http.disconnect"}

    reader = _Reader(on_event)
    await pipeline(gw, endpoint, scope, receive, reader.send)
    return reader.status, bytes(reader.body)


def _pieces(head: bytes, file: IO[bytes] | None, size: int, tail: bytes
            ) -> Iterator[tuple[bytes, bool]]:  # fmt: skip
    """The body in pieces, each with whether more follow. The file is read where it is
    needed (a seek and a read with no await between them: another reader's seek cannot
    come in between)."""
    yield head, bool(size or tail)
    offset = 0
    while file is not None and offset < size:
        file.seek(offset)
        data = file.read(min(PIECE, size - offset))
        if not data:
            break
        offset += len(data)
        yield data, offset < size or bool(tail)
    if tail:
        yield tail, False

"""HTTP/1.1 by hand, for hostile clients in tests and benchmarks: raw sockets that send what
no library would (partial headers, bodies that never end) from a chosen source address,
leave when the test says, and read what the server answered until it closed."""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Callable, Iterable
from typing import Any

import httpx


def connect(url: str, source: str | None = None, timeout: float = 10) -> socket.socket:
    """A connection to `url`'s host and port, from `source` (a loopback address: on Linux
    127.0.0.2, 127.0.0.3, ... are distinct clients of a server on 127.0.0.1)."""
    host, port = url.removeprefix("http://").split(":")
    address = (source, 0) if source else None
    return socket.create_connection((host, int(port)), timeout=timeout, source_address=address)


def answer(s: socket.socket) -> tuple[int, bytes]:
    """The status and the rest of what the server sent, until it closed the connection."""
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    return int(data.split(b" ", 2)[1]), data


def response(s: socket.socket) -> bytes:
    """One response with a `Content-Length`, on a connection the server may keep open."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += s.recv(65536)
    head = data.split(b"\r\n\r\n", 1)[0].lower()
    length = int(head.split(b"content-length: ", 1)[1].split(b"\r\n", 1)[0])
    while len(data) < len(head) + 4 + length:
        data += s.recv(65536)
    return data


def sent_until_closed(s: socket.socket, chunks: Iterable[bytes], pause: float = 0) -> bool:
    """Send the chunks; True if the server closed the connection before the last."""
    try:
        for chunk in chunks:
            s.sendall(chunk)
            time.sleep(pause)
    except OSError:
        return True
    return False


def parse(data: bytes) -> tuple[int, dict[str, str], Any]:
    """One whole response (as `answer` reads it): status, headers (lower-cased), JSON body."""
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return (
        int(lines[0].split(" ", 2)[1]),
        {k.lower(): v for k, v in headers.items()},
        json.loads(body),
    )


def trickle(s: socket.socket, chunks: Iterable[bytes], pause: float) -> bytes:
    """Send the chunks `pause` seconds apart until the server answers (or closes, or they
    run out): what it sent by then, and until it closed or went quiet for a second."""
    data = b""
    s.settimeout(pause or 0.01)
    try:
        for chunk in chunks:
            s.sendall(chunk)
            with contextlib.suppress(TimeoutError):
                data = s.recv(65536)
                if not data:
                    return data
                break
        s.settimeout(1)
        while chunk := s.recv(65536):
            data += chunk
    except OSError:  # a reset, or a second without a byte
        pass
    return data


def leave(request: httpx.Request, reached: Callable[[], bool], timeout: float = 30) -> None:
    """Send `request` and close the connection as soon as `reached()` holds (say, once the
    workers have it): a client that leaves mid-request at a point the test chooses, rather
    than after a timeout that a loaded machine can outrun."""
    body = request.read()
    head = f"{request.method} {request.url.raw_path.decode()} HTTP/1.1\r\n" + "".join(
        f"{k}: {v}\r\n" for k, v in request.headers.items()
    )
    with connect(f"http://{request.url.host}:{request.url.port}") as s:
        s.sendall(head.encode() + b"\r\n" + body)
        deadline = time.monotonic() + timeout
        while not reached():
            assert time.monotonic() < deadline, f"not reached in {timeout} s"
            time.sleep(0.02)

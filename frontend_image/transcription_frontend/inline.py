"""Audio inline in JSON (base64, as chat's `input_audio` carries it) without a whole copy of
it in memory.

Out: `json_pieces` encodes a JSON value piece by piece, as `dumps` would whole; a long
string goes in slices, and a `Base64Of` leaf (a spooled file) is base64-encoded as it is
read, so the body an audio language model's pool is sent (the upload, inline) is never held
whole. In: `Base64Reader` reads a base64 string as the file it encodes, decoding only the
bytes asked for, so that sniffing a chat's audio part (its header, maybe its last page)
does not decode the whole of it.
"""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any

PIECE = 48 * 1024  # bytes of a file encoded at once (a multiple of 3: no padding between)
SLICE = 64 * 1024  # characters of a long string encoded at once


def dumps(doc: Any) -> bytes:
    """Compact JSON, as engines send it."""
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode()


@dataclass(frozen=True)
class Base64Of:
    """A JSON string leaf: the base64 of `size` bytes of a spooled file, read when sent."""

    file: IO[bytes]
    size: int

    def __len__(self) -> int:
        return 2 + 4 * ((self.size + 2) // 3)  # with its quotes

    def pieces(self) -> Iterator[bytes]:
        yield b'"'
        # Each piece is read at its own offset, seek and read together: another attempt's
        # body that is still being sent cannot move this one's position.
        offset = 0
        while offset < self.size:
            self.file.seek(offset)
            chunk = self.file.read(min(PIECE, self.size - offset))
            if not chunk:
                raise ValueError(f"the spooled file ended at {offset} of {self.size} bytes")
            offset += len(chunk)
            yield base64.b64encode(chunk)
        yield b'"'


Piece = bytes | Base64Of


def json_pieces(value: Any) -> Iterator[Piece]:
    """`dumps(value)` in pieces (joined, the same bytes), `Base64Of` leaves left to the
    caller; no piece holds more than a slice of a long string."""
    if isinstance(value, Base64Of):
        yield value
    elif isinstance(value, dict):
        yield b"{"
        for i, (k, v) in enumerate(value.items()):
            yield (b"," if i else b"") + dumps(str(k)) + b":"
            yield from json_pieces(v)
        yield b"}"
    elif isinstance(value, list | tuple):
        yield b"["
        for i, v in enumerate(value):
            if i:
                yield b","
            yield from json_pieces(v)
        yield b"]"
    elif isinstance(value, str) and len(value) > SLICE:
        yield b'"'
        for at in range(0, len(value), SLICE):  # a str slice never splits a character
            yield dumps(value[at : at + SLICE])[1:-1]
        yield b'"'
    else:
        yield dumps(value)


def encoded(value: Any) -> Iterator[bytes]:
    """`dumps(value)` in pieces, the files of its `Base64Of` leaves read and encoded."""
    for piece in json_pieces(value):
        if isinstance(piece, Base64Of):
            yield from piece.pieces()
        else:
            yield piece


def encoded_length(value: Any) -> int:
    """`len(dumps(value))`, without reading its `Base64Of` leaves' files."""
    return sum(len(p) for p in json_pieces(value))


class Base64Reader(io.RawIOBase):
    """A seekable, read-only file of the bytes a (valid, unbroken) base64 string encodes,
    decoded as they are read."""

    def __init__(self, data: str) -> None:
        self.data = data
        pad = len(data) - len(data.rstrip("="))
        self.size = len(data) // 4 * 3 - pad
        self.pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        end = min(self.pos + len(view), self.size)
        if end <= self.pos:
            return 0
        first, last = self.pos // 3, (end + 2) // 3  # the 4-character groups that hold them
        decoded = base64.b64decode(self.data[first * 4 : last * 4])
        got = decoded[self.pos - first * 3 : end - first * 3]
        view[: len(got)] = got
        self.pos += len(got)
        return len(got)

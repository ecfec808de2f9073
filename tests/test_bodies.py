"""Bodies without several copies in memory: JSON encoded piece by piece (with a spooled
file's base64 inline), a base64 string read as the file it encodes, and the budget of body
bytes held in memory. Pure functions; the same over real HTTP in test_chat.py and
test_chat_transcription.py."""

from __future__ import annotations

import base64
import io
import json
import os
from typing import Any

import pytest

from transcription_api.errors import APIError
from transcription_api.frontend import FrontendLimits
from transcription_frontend.inline import (
    PIECE,
    SLICE,
    Base64Of,
    Base64Reader,
    dumps,
    encoded,
    encoded_length,
    json_pieces,
)
from transcription_frontend.limits import BodyBudget

LONG = 'a "quoted"\nline, é and 😀 \\ ' * (3 * SLICE // 20)  # escapes across slices
VALUES: list[Any] = [
    {}, [], "", 0, -1.5, True, None, "x" * SLICE, "é" * (SLICE + 1), LONG,
    {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": LONG}]}],
     "n": 1, "temperature": 0.0, "stop": None, "stream": False, "nested": [[1, [2, {}]]]},
]  # fmt: skip


@pytest.mark.parametrize("value", VALUES)
def test_json_in_pieces_is_dumps(value: Any) -> None:
    assert b"".join(encoded(value)) == dumps(value)
    assert encoded_length(value) == len(dumps(value))


def test_no_piece_holds_more_than_a_slice_of_a_long_string() -> None:
    pieces = list(json_pieces({"text": LONG}))
    assert max(len(p) for p in pieces if isinstance(p, bytes)) <= 2 * SLICE  # é: 2 bytes
    assert len(pieces) > len(LONG) // SLICE


@pytest.mark.parametrize("size", [0, 1, 2, 3, PIECE - 1, PIECE, PIECE + 1, 3 * PIECE + 2])
def test_a_spooled_file_inline_is_its_base64(size: int) -> None:
    data = os.urandom(size)
    leaf = Base64Of(io.BytesIO(data), size)
    value = {"input_audio": {"data": leaf, "format": "wav"}}
    want = dumps({"input_audio": {"data": base64.b64encode(data).decode(), "format": "wav"}})
    assert b"".join(encoded(value)) == want
    assert encoded_length(value) == len(want)  # without reading the file
    assert b"".join(encoded(value)) == want  # again: each attempt reads it afresh
    assert all(len(p) <= PIECE * 4 // 3 for p in leaf.pieces())


def test_a_spooled_file_shorter_than_said_fails_loudly() -> None:
    with pytest.raises(ValueError, match="ended at 3 of 10 bytes"):
        b"".join(encoded(Base64Of(io.BytesIO(b"abc"), 10)))


@pytest.mark.parametrize("size", [0, 1, 2, 3, 4, 5, 1000, 4097])
def test_a_base64_string_reads_as_the_file_it_encodes(size: int) -> None:
    data = os.urandom(size)
    f = Base64Reader(base64.b64encode(data).decode())
    assert f.size == size
    assert f.read() == data
    for start in sorted({0, 1, 2, 3, size // 2, max(size - 1, 0), size, size + 5}):
        for n in (0, 1, 2, 3, 7, 4096):
            f.seek(start)
            assert f.read(n) == data[start : start + n], (start, n)
    assert f.seek(-2, io.SEEK_END) == max(size - 2, 0)
    assert io.BufferedReader(f).read() == data[max(size - 2, 0) :]


def test_the_budget_refuses_past_it_and_releases_once() -> None:
    budget = BodyBudget(FrontendLimits(buffered_body_bytes=1024**2))
    with budget.hold(700_000, "chat completion body"):
        assert budget.bytes == 700_000
        with pytest.raises(APIError) as refused, budget.hold(400_000, "chat completion body"):
            pass
        e = refused.value
        assert e.status == 503 and e.headers == {"Retry-After": "1"}
        assert e.code == "memory_budget_exceeded" and "(bufferedBodyBytes)" in e.message
        assert "400000 bytes" in e.message and "1048576 bytes" in e.message
        assert budget.bytes == 700_000  # the refused one never counted
        with budget.hold(348_576, "chat completion body"):  # exactly to the limit
            assert budget.bytes == 1024**2
    assert budget.bytes == 0
    with pytest.raises(RuntimeError), budget.hold(1024**2, "chat completion body"):
        raise RuntimeError("the request failed")
    assert budget.bytes == 0


def test_a_holder_reserves_within_the_budget_and_settles_to_what_it_holds() -> None:
    """A realtime session's buffer: grows only within the budget shared with the bodies,
    shrinks and is released without a refusal."""
    budget = BodyBudget(FrontendLimits(buffered_body_bytes=1024**2))
    buffer = budget.holder("realtime append")
    with budget.hold(500_000, "chat completion body"):
        buffer.reserve(500_000)
        assert budget.bytes == 1_000_000
        with pytest.raises(APIError) as refused:
            buffer.reserve(600_000)  # 100,000 more: past 1,048,576
        assert refused.value.code == "memory_budget_exceeded"
        assert "realtime append of 100000 bytes" in refused.value.message
        assert (budget.bytes, buffer.size) == (1_000_000, 500_000)  # nothing counted
        buffer.settle(200_000)  # a turn committed out of it
        buffer.reserve(548_576)  # exactly to the limit
        assert budget.bytes == 1024**2
        buffer.settle(600_000)  # what is held is counted, never refused
        assert budget.bytes == 1024**2 + 51_424
    buffer.settle(0)  # the session is gone
    assert budget.bytes == 0


def test_json_pieces_parse_back() -> None:
    value = VALUES[-1]
    assert json.loads(b"".join(encoded(value))) == value

"""Realtime sessions for tests and benchmarks: speech as the PCM a client streams, cut
into appends, and the official SDK's connection read until an event arrives."""

from __future__ import annotations

import base64
import random
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter

from testkit.audio import speak

RATE = 24000  # OpenAI's audio/pcm


def pcm(text: str, directory: Path, rate: int = RATE) -> bytes:
    """`text` spoken by espeak-ng, as raw 16-bit mono PCM at `rate`."""
    wav = speak(text, directory)
    out = wav.with_suffix(f".{rate}.raw")
    if not out.exists():
        subprocess.run(["sox", str(wav), "-r", str(rate), "-c", "1", "-b", "16", "-e", "signed",
                        "-t", "raw", str(out)], check=True)  # fmt: skip
    return out.read_bytes()


def silence(seconds: float, rate: int = RATE) -> bytes:
    return bytes(2 * round(seconds * rate))


def conversation(texts: list[str], directory: Path, pause: float = 1.2, rate: int = RATE) -> bytes:
    """The sentences one after another, `pause` seconds of silence before, between and after."""
    out = silence(0.5, rate)
    for text in texts:
        out += pcm(text, directory, rate) + silence(pause, rate)
    return out


def appends(data: bytes, rate: int = RATE, seed: int = 0, lo_ms: int = 20, hi_ms: int = 100
            ) -> Iterator[str]:  # fmt: skip
    """The audio in base64 pieces of 20-100 ms, as a client streams it."""
    rng = random.Random(seed)
    i = 0
    while i < len(data):
        n = 2 * (rate * rng.randint(lo_ms, hi_ms) // 1000)
        yield base64.b64encode(data[i : i + n]).decode()
        i += n


def server_event(raw: bytes | str) -> Any:
    """A server event validated strictly against the installed SDK's own types."""
    from openai.types.realtime import RealtimeServerEvent

    return TypeAdapter(RealtimeServerEvent).validate_json(raw)


async def until(connection: Any, *types: str, seconds: float = 60) -> list[Any]:
    """Server events (validated) up to and including the first of one of these types."""
    import asyncio

    seen: list[Any] = []
    async with asyncio.timeout(seconds):
        while True:
            event = server_event(await connection.recv_bytes())
            seen.append(event)
            if event.type in types:
                return seen

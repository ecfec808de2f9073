"""Realtime sessions for tests and benchmarks: speech as the PCM a client streams, cut
into appends, and the official SDK's connection read until an event arrives."""

from __future__ import annotations

import base64
import random
import subprocess
from collections.abc import Callable, Iterator
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
        subprocess.run(["sox", "-R", str(wav), "-r", str(rate), "-c", "1", "-b", "16", "-e", "signed",
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


# Told of each server event as it arrives: (time.monotonic() on arrival, the event).
OnEvent = Callable[[float, Any], None]
# Told of each append once sent: (time.monotonic(), seconds of audio sent with it included).
OnAppend = Callable[[float, float], None]


async def until(connection: Any, *types: str, seconds: float = 60,
                on_event: OnEvent | None = None) -> list[Any]:  # fmt: skip
    """Server events (validated) up to and including the first of one of these types;
    `on_event` is told of each as it arrives."""
    import asyncio
    import time

    seen: list[Any] = []
    async with asyncio.timeout(seconds):
        while True:
            raw = await connection.recv_bytes()
            arrived = time.monotonic()
            event = server_event(raw)
            if on_event is not None:
                on_event(arrived, event)
            seen.append(event)
            if event.type in types:
                return seen


async def transcribe_turns(base_url: str, audio: bytes, turns: int, *, vad: bool = True,
                           model: str = "whisper-1", pace: float = 0.0, api_key: str = "none",
                           on_event: OnEvent | None = None,
                           on_append: OnAppend | None = None) -> list[Any]:  # fmt: skip
    """One session through the official SDK: `audio` (24 kHz PCM) streamed in 20-100 ms
    appends (`pace`: 1.0 = real time, 0 = as fast as it goes); with `vad` the server finds
    the turns, else the whole audio is one committed turn. Every server event until the
    `turns`-th item is done, validated against the SDK's types. Events are read while the
    audio is sent, so `on_event` (every event, the session's own included) and `on_append`
    timestamps are when each arrived and each append left."""
    import asyncio
    import time

    import openai

    client = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key=api_key, max_retries=0)
    session: dict[str, Any] = {"type": "transcription",
                               "audio": {"input": {"transcription": {"model": model}}}}  # fmt: skip
    if not vad:
        session["audio"]["input"]["turn_detection"] = None
    async with client.realtime.connect(extra_query={"intent": "transcription"}) as conn:
        await until(conn, "session.created", on_event=on_event)
        await conn.send({"type": "session.update", "session": session})  # type: ignore[arg-type]
        await until(conn, "session.updated", on_event=on_event)

        async def send() -> None:
            started = time.monotonic()
            sent = 0.0
            for piece in appends(audio):
                await conn.send({"type": "input_audio_buffer.append", "audio": piece})
                sent += len(base64.b64decode(piece)) / 2 / RATE
                if on_append is not None:
                    on_append(time.monotonic(), sent)
                if pace:
                    await asyncio.sleep(max(0.0, started + sent / pace - time.monotonic()))
            if not vad:
                await conn.send({"type": "input_audio_buffer.commit"})

        async def receive() -> list[Any]:
            events: list[Any] = []
            for _ in range(turns):
                events += await until(conn, "conversation.item.done", seconds=300,
                                      on_event=on_event)  # fmt: skip
            return events

        sender, receiver = asyncio.create_task(send()), asyncio.create_task(receive())
        try:
            await asyncio.wait({sender, receiver}, return_when=asyncio.FIRST_EXCEPTION)
            for task in (sender, receiver):
                if task.done() and task.exception() is not None:
                    await task  # raises its exception
            await sender  # all audio is sent before the session closes, as before
            return await receiver
        finally:
            for task in (sender, receiver):
                task.cancel()


def refusal(url: str, **kw: Any) -> tuple[int, dict[str, str], dict[str, Any]]:
    """A WebSocket upgrade the server refuses: its HTTP status, headers and JSON body
    (`websockets.connect`'s keywords: headers, subprotocols)."""
    import asyncio
    import json

    import websockets

    async def connect() -> tuple[int, dict[str, str], dict[str, Any]]:
        try:
            async with websockets.connect(url, **kw):
                raise AssertionError("the upgrade was accepted")
        except websockets.InvalidStatus as e:
            r = e.response
            return r.status_code, dict(r.headers), json.loads(r.body or b"{}")

    return asyncio.run(connect())


def transcripts(events: list[Any]) -> list[str]:
    """The completed turns' transcripts, in the order their items were committed."""
    order = [e.item_id for e in events if e.type == "input_audio_buffer.committed"]
    done = {e.item_id: e.transcript for e in events
            if e.type == "conversation.item.input_audio_transcription.completed"}  # fmt: skip
    return [done.get(i, "") for i in order]

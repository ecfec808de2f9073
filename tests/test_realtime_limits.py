"""Realtime sessions against clients that would exhaust the gateway (issue 37): the real
frontend process (`transcription-frontend`, as the pod runs it) on a gateway's routes, two
deployments behind a stand-in vLLM worker, with API keys, over real WebSockets.

Each refusal is an `error` event in OpenAI's shape naming the limit, and the session goes
on; a key scoped to other models cannot open a session, nor move one to such a model. What
ten sessions of the largest appends cost in memory is a benchmark (`python -m bench
hostile`)."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import numpy as np
import pytest
import websockets

from testkit.frontend import pool
from testkit.processes import frontend, stop
from testkit.realtime import refusal, server_event
from testkit.standins import Behaviour, serve, vllm_app
from transcription_api.frontend import FrontendLimits
from transcription_api.routes import Routes, RouteTable

RATE = 24000  # audio/pcm
APPEND = 1024 * 1024  # the default realtimeMaxAppendBytes
BUFFER_S = 30.0
BUDGET = 2 * 1024**2  # bufferedBodyBytes: room for one full buffer (1,440,000 bytes), not two
LIMITS = FrontendLimits(realtime_max_buffer_seconds=BUFFER_S, buffered_body_bytes=BUDGET)
MANUAL = {"type": "transcription", "audio": {"input": {"turn_detection": None}}}


def table(name: str, alias: str, url: str) -> RouteTable:
    return RouteTable(model=name, aliases=[alias], namespace="speech",
                      deployment=f"speech/{name}", pools=[pool(f"{name}/batch", [url])])  # fmt: skip


WORKER = Behaviour()  # the stand-in's: what it was sent


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    d = tmp_path_factory.mktemp("realtime-limits")
    keys = d / "keys"
    keys.write_text("k-all\nk-large large\n")
    with serve(vllm_app(["large", "whisper-1"], WORKER)) as worker:
        routes = Routes(deployments=[table("large", "whisper-1", worker.url),
                                     table("tiny", "tiny-1", worker.url)])  # fmt: skip
        url, proc = frontend(routes, d, limits=LIMITS, api_keys_path=keys)
        yield url.replace("http://", "ws://") + "/v1/realtime?intent=transcription"
        stop(proc)


def noise(seconds: float, seed: int = 0) -> bytes:
    """24 kHz PCM16 white noise (the VAD scores it; no speech to transcribe)."""
    rng = np.random.default_rng(seed)
    return rng.integers(-3000, 3000, round(seconds * RATE), dtype="<i2").tobytes()


@asynccontextmanager
async def session(url: str, key: str = "k-all", model: str | None = "large",
                  **update: Any) -> AsyncIterator[Any]:  # fmt: skip
    """A session opened with `key` on `model`, updated with `update` (session fields)."""
    query = f"&model={model}" if model else ""
    headers = {"Authorization": f"Bearer {key}"}
    async with websockets.connect(url + query, additional_headers=headers,
                                  max_size=None) as ws:  # fmt: skip
        assert (await event(ws)).type == "session.created"
        if update:
            await send(ws, "session.update", session={"type": "transcription", **update})
            assert (await event(ws)).type == "session.updated"
        yield ws


async def send(ws: Any, kind: str, **fields: Any) -> None:
    await ws.send(json.dumps({"type": kind, **fields}))


async def append(ws: Any, pcm: bytes, event_id: str | None = None) -> None:
    await send(ws, "input_audio_buffer.append", audio=base64.b64encode(pcm).decode(),
               **({"event_id": event_id} if event_id else {}))  # fmt: skip


async def event(ws: Any, seconds: float = 30) -> Any:
    return server_event(await asyncio.wait_for(ws.recv(), seconds))


async def until(ws: Any, kind: str, seconds: float = 60) -> list[Any]:
    seen = [await event(ws, seconds)]
    while seen[-1].type != kind:
        seen.append(await event(ws, seconds))
    return seen


async def a_turn_is_transcribed(ws: Any) -> None:
    """The session still works: a manual turn of a second is committed and transcribed."""
    await send(ws, "session.update", session=MANUAL)
    await until(ws, "session.updated")
    await send(ws, "input_audio_buffer.clear")
    await until(ws, "input_audio_buffer.cleared")
    await append(ws, noise(1.0))
    await send(ws, "input_audio_buffer.commit")
    events = await until(ws, "conversation.item.done")
    assert any(e.type.endswith("transcription.completed") for e in events), events


def test_an_append_over_the_limit_gets_an_error_event_and_the_session_goes_on(
    gateway: str,
) -> None:
    async def scenario() -> None:
        async with session(gateway) as ws:
            await append(ws, bytes(APPEND + 2), event_id="evt_big")
            error = await event(ws)
            assert error.type == "error" and error.error.type == "invalid_request_error"
            assert (error.error.code, error.error.param, error.error.event_id) == (
                "append_too_large", "audio", "evt_big",
            )  # fmt: skip
            assert f"at most {APPEND} bytes" in error.error.message
            assert "realtimeMaxAppendBytes" in error.error.message
            assert "smaller appends" in error.error.message
            await a_turn_is_transcribed(ws)

    asyncio.run(scenario())


def test_a_message_over_twice_the_limit_is_closed_with_1009_unread(gateway: str) -> None:
    async def scenario() -> int | None:
        async with session(gateway) as ws:
            await append(ws, bytes(3 * APPEND))
            with pytest.raises(websockets.ConnectionClosedError) as closed:
                await event(ws)
            return closed.value.rcvd.code if closed.value.rcvd else None

    assert asyncio.run(scenario()) == 1009

    async def another() -> None:  # the gateway serves on
        async with session(gateway) as ws:
            await a_turn_is_transcribed(ws)

    asyncio.run(another())


def test_the_input_buffer_holds_at_most_its_limit(gateway: str) -> None:
    async def scenario() -> None:
        async with session(gateway, **MANUAL) as ws:
            half = noise(BUFFER_S / 2)  # 15 s: 720,000 bytes, within an append's limit
            await append(ws, half)
            await append(ws, half)  # exactly full
            await append(ws, noise(0.1), event_id="evt_over")
            error = await event(ws)
            assert (error.type, error.error.type, error.error.code, error.error.event_id) == (
                "error", "invalid_request_error", "input_audio_buffer_full", "evt_over",
            )  # fmt: skip
            assert f"at most {BUFFER_S:g} s" in error.error.message
            assert "realtimeMaxBufferSeconds" in error.error.message
            # committed, the full buffer is one turn; then the buffer takes audio again
            await send(ws, "input_audio_buffer.commit")
            events = await until(ws, "conversation.item.done")
            (done,) = [e for e in events if e.type.endswith("transcription.completed")]
            assert done.usage.seconds == pytest.approx(BUFFER_S, abs=0.1)
            await append(ws, half)
            await send(ws, "input_audio_buffer.clear")
            assert (await event(ws)).type == "input_audio_buffer.cleared"

    asyncio.run(scenario())


async def fill(ws: Any, seconds: float) -> list[Any]:
    """Append `seconds` of audio in appends of 15 s; the events they caused, up to the
    session.updated that shows every one was taken (a manual session's appends answer
    nothing when they are)."""
    for n in range(round(seconds / 15)):
        await append(ws, noise(15, seed=n), event_id=f"evt_fill_{n}")
    await send(ws, "session.update", session=MANUAL)
    return await until(ws, "session.updated")


def test_the_sessions_buffers_share_the_memory_budget(gateway: str) -> None:
    """Each session's uncommitted audio counts in `bufferedBodyBytes`: an append that would
    pass it is refused whole with an error event naming it, the session goes on, and the
    room comes back when another session's buffer is cleared or closed."""

    async def scenario() -> None:
        async with session(gateway, **MANUAL) as a, session(gateway, **MANUAL) as b:
            assert [e.type for e in await fill(a, 30)] == ["session.updated"]  # 1,440,000
            error, _ = await fill(b, 15)  # 720,000 more: past 2 MiB
            assert (error.type, error.error.type, error.error.code, error.error.param,
                    error.error.event_id) == ("error", "server_error", "memory_budget_exceeded",
                                              "audio", "evt_fill_0")  # fmt: skip
            assert "realtime append of 720000 bytes" in error.error.message
            assert f"limit of {BUDGET} bytes (bufferedBodyBytes)" in error.error.message
            await send(b, "input_audio_buffer.commit")  # nothing of it was taken
            assert (await event(b)).error.code == "input_audio_buffer_commit_empty"
            await send(a, "input_audio_buffer.clear")
            await until(a, "input_audio_buffer.cleared")
            assert [e.type for e in await fill(b, 15)] == ["session.updated"]
            await send(b, "input_audio_buffer.commit")
            events = await until(b, "conversation.item.done")
            (done,) = [e for e in events if e.type.endswith("transcription.completed")]
            assert done.usage.seconds == pytest.approx(15, abs=0.1)
            assert [e.type for e in await fill(a, 15)] == ["session.updated"]
        # the closed sessions count nothing: a new one takes a full buffer (once the gateway
        # has seen them close)
        for _ in range(20):
            async with session(gateway, **MANUAL) as c:
                events = await fill(c, 30)
                if [e.type for e in events] == ["session.updated"]:
                    return
                assert events[0].error.code == "memory_budget_exceeded", events
            await asyncio.sleep(0.5)
        raise AssertionError("the closed sessions' buffers still count after 10 s")

    asyncio.run(scenario())


def test_a_key_scoped_to_other_models_cannot_open_a_session_on_them(gateway: str) -> None:
    status, _, body = refusal(gateway + "&model=tiny",
                              additional_headers={"Authorization": "Bearer k-large"})  # fmt: skip
    assert status == 403
    assert (body["error"]["code"], body["error"]["param"]) == ("model_not_allowed", "model")


def test_a_session_cannot_be_moved_to_a_model_its_key_may_not_use(gateway: str) -> None:
    async def scenario() -> None:
        async with session(gateway, key="k-large") as ws:
            tiny = {"audio": {"input": {"transcription": {"model": "tiny-1"}}}}
            await send(ws, "session.update", event_id="evt_move",
                       session={"type": "transcription", **tiny})  # fmt: skip
            error = await event(ws)
            assert (error.type, error.error.code, error.error.event_id) == (
                "error", "model_not_allowed", "evt_move",
            )  # fmt: skip
            assert error.error.param == "session.audio.input.transcription.model"
            await a_turn_is_transcribed(ws)  # on its own model still

    asyncio.run(scenario())


def test_the_largest_append_is_scored_in_windows_and_the_session_answers_meanwhile(
    gateway: str,
) -> None:
    """Server VAD over an append of the largest size: pings are answered while it is scored,
    another session is served meanwhile, and its own next event is answered after it."""

    async def scenario() -> tuple[float, float, float]:
        async with session(gateway) as ws, session(gateway) as other:
            audio = noise(APPEND / 2 / RATE, seed=1)
            started = time.monotonic()
            await append(ws, audio)
            await send(ws, "input_audio_buffer.clear")
            pong = await ws.ping()
            await send(other, "input_audio_buffer.clear")
            await asyncio.wait_for(pong, 10)
            ponged = time.monotonic() - started
            await until(other, "input_audio_buffer.cleared", seconds=10)
            served = time.monotonic() - started
            await until(ws, "input_audio_buffer.cleared", seconds=60)
            return ponged, served, time.monotonic() - started

    ponged, served, cleared = asyncio.run(scenario())
    print(f"largest append: pong after {ponged:.3f}s, the other session served after "
          f"{served:.3f}s, the append scored after {cleared:.3f}s")  # fmt: skip
    assert ponged < 2 and served < 2, (ponged, served, cleared)


@pytest.mark.parametrize("fmt", ["audio/pcm", "audio/pcmu"])
def test_an_append_split_into_windows_keeps_every_byte(gateway: str, fmt: str) -> None:
    """Manual commits: the committed turn is as long as all the appends, whatever their
    size against the windows they are decoded in."""

    async def scenario() -> None:
        update = {"audio": {"input": {"turn_detection": None, "format": {"type": fmt}}}}
        async with session(gateway, **update) as ws:
            for size in sizes:
                await append(ws, bytes(size * (2 if fmt == "audio/pcm" else 1)))
            await send(ws, "input_audio_buffer.commit")
            events = await until(ws, "conversation.item.done")
            assert any(e.type.endswith("transcription.completed") for e in events), events

    sizes = (1, 47_999, 48_001, 123_457)  # samples; a window decodes 48,000 bytes
    asyncio.run(scenario())
    # the turn's WAV: a 44-byte header and 16-bit samples, every one of them
    assert WORKER.seen[-1].file_bytes == 44 + 2 * sum(sizes)


def test_a_truncated_or_odd_append_is_refused_whole(gateway: str) -> None:
    async def scenario() -> None:
        async with session(gateway, **MANUAL) as ws:
            good = base64.b64encode(bytes(200_000)).decode()
            for audio, code in [(good[:-1], "invalid_value"), (good[:100_000] + "*" + good,
                                "invalid_value"), (base64.b64encode(bytes(3)).decode(),
                                "invalid_value")]:  # fmt: skip
                await send(ws, "input_audio_buffer.append", audio=audio)
                error = await event(ws)
                assert (error.type, error.error.code, error.error.param) == ("error", code, "audio")
            await send(ws, "input_audio_buffer.commit")  # nothing of them was taken
            error = await event(ws)
            assert error.error.code == "input_audio_buffer_commit_empty"

    asyncio.run(scenario())

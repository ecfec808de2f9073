"""Realtime transcription (`/v1/realtime?intent=transcription`) through the gateway over a
real WebSocket, driven by the official SDK's realtime client: every server event is
validated against the SDK's own types. Real speech (espeak-ng), Silero VAD, and the real
CPU worker (faster-whisper, tiny.en) or the vLLM stand-in behind the pools."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import websockets

from testkit.audio import SENTENCES, wer
from testkit.frontend import PATIENCE, PRIMARY, Frontend, pool
from testkit.realtime import appends, conversation, pcm, refusal, server_event, silence, until
from testkit.standins import Behaviour, Running, serve, vllm_app
from transcription_api.capabilities import Engine, Mode
from transcription_api.frontend import FrontendLimits
from transcription_api.routes import RouteTable

INTENT = {"intent": "transcription"}
MANUAL = {"type": "transcription", "audio": {"input": {"turn_detection": None}}}


@pytest.fixture(scope="module")
def speech_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("speech")


@pytest.fixture
def real(cpu_worker: Running) -> Iterator[Frontend]:
    """The gateway before the real CPU worker (a faster-whisper pool)."""
    fw = pool("fw", [cpu_worker.url], engine=Engine.FASTER_WHISPER, mode=Mode.SEQUENTIAL)
    fe = Frontend(RouteTable(model="whisper-tiny.en", aliases=["whisper-1"], pools=[fw]))
    yield fe
    fe.running.stop()


@pytest.fixture
def standin(tmp_path: Path) -> Iterator[tuple[Frontend, Behaviour]]:
    """The gateway before the vLLM stand-in, with small realtime limits."""
    b = Behaviour()
    with serve(vllm_app([PRIMARY, "whisper-1"], b)) as worker:
        table = RouteTable(
            model=PRIMARY, aliases=["whisper-1"], pools=[pool("batch", [worker.url])]
        )
        limits = FrontendLimits(max_realtime_sessions=2, realtime_max_append_bytes=64 * 1024,
                                realtime_idle_timeout_seconds=3)  # fmt: skip
        fe = Frontend(table, limits=limits)
        yield fe, b
        fe.running.stop()


def client(fe: Frontend, key: str = "none") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{fe.url}/v1", api_key=key, max_retries=0)


def ws_url(fe: Frontend, query: str = "intent=transcription") -> str:
    return fe.url.replace("http://", "ws://") + "/v1/realtime?" + query


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def stream(conn: Any, data: bytes) -> None:
    for piece in appends(data):
        await conn.send({"type": "input_audio_buffer.append", "audio": piece})


# ---- the contract, with real speech and the real CPU worker


def test_server_vad_turns_are_transcribed_in_order_by_the_real_worker(
    real: Frontend, speech_dir: Path
) -> None:
    texts = SENTENCES[:2]
    audio = conversation(texts, speech_dir)
    # the metrics are the process's: counted from here
    turns = real.metric("transcription_frontend_realtime_turns_total", outcome="completed")
    served = real.metric("transcription_frontend_requests_total", pool="fw", status="200")

    async def scenario() -> list[Any]:
        async with client(real).realtime.connect(extra_query=INTENT) as conn:
            (created,) = await until(conn, "session.created")
            assert created.session.type == "transcription"
            await conn.send({"type": "session.update",
                             "session": {"type": "transcription",
                                         "audio": {"input": {"transcription": {"model": "whisper-1"}}}}})  # fmt: skip
            await until(conn, "session.updated")
            await stream(conn, audio)
            events: list[Any] = []
            done = 0
            while done < 2:
                events += await until(conn, "conversation.item.done")
                done += 1
            return events

    events = run(scenario())
    kinds = [e.type for e in events]
    assert kinds.count("input_audio_buffer.speech_started") == 2, kinds
    assert kinds.count("input_audio_buffer.speech_stopped") == 2, kinds
    completed = [e for e in events if e.type.endswith("transcription.completed")]
    committed = [e for e in events if e.type == "input_audio_buffer.committed"]
    assert [c.item_id for c in committed] == [c.item_id for c in completed]
    assert committed[0].previous_item_id is None
    assert committed[1].previous_item_id == committed[0].item_id
    for text, c in zip(texts, completed, strict=True):
        assert wer(text, c.transcript) <= 0.1, (text, c.transcript)
        assert c.usage.type == "duration" and 1 < c.usage.seconds < 10
    # every turn: started < stopped, in the audio's time; each item added before it is done
    starts = [e.audio_start_ms for e in events if e.type.endswith("speech_started")]
    stops = [e.audio_end_ms for e in events if e.type.endswith("speech_stopped")]
    assert starts[0] < stops[0] < starts[1] < stops[1] <= len(audio) / 48
    for c in completed:
        order = [i for i, e in enumerate(events) if getattr(e, "item_id", None) == c.item_id
                 or getattr(getattr(e, "item", None), "id", None) == c.item_id]  # fmt: skip
        assert [events[i].type for i in order][-1] == "conversation.item.done"
    assert (
        real.metric("transcription_frontend_realtime_turns_total", outcome="completed") == turns + 2
    )
    assert (
        real.metric("transcription_frontend_requests_total", pool="fw", status="200") == served + 2
    )


def test_manual_commits_with_logprobs_and_g711(real: Frontend, speech_dir: Path) -> None:
    """turn_detection null: the client commits; audio/pcmu at 8 kHz; far-field noise
    reduction; logprobs included."""
    import numpy as np

    text = SENTENCES[2]
    linear = np.frombuffer(pcm(text, speech_dir, 8000), dtype="<i2").astype(np.int32)
    ulaw = bytes(_ulaw(int(x)) for x in linear)

    async def scenario() -> list[Any]:
        async with client(real).realtime.connect(extra_query=INTENT) as conn:
            await conn.send({"type": "session.update", "session": {
                "type": "transcription", "include": ["item.input_audio_transcription.logprobs"],
                "audio": {"input": {"turn_detection": None, "format": {"type": "audio/pcmu"},
                                    "noise_reduction": {"type": "far_field"}}}}})  # fmt: skip
            updated = (await until(conn, "session.updated"))[-1]
            assert updated.session.audio.input.turn_detection is None
            for i in range(0, len(ulaw), 800):
                await conn.send({"type": "input_audio_buffer.append",
                                 "audio": base64.b64encode(ulaw[i : i + 800]).decode()})  # fmt: skip
            await conn.send({"type": "input_audio_buffer.commit"})
            return await until(conn, "conversation.item.done")

    events = run(scenario())
    assert not [e for e in events if e.type.startswith("input_audio_buffer.speech")]
    (done,) = [e for e in events if e.type.endswith("transcription.completed")]
    assert wer(text, done.transcript) <= 0.1, done.transcript
    assert done.logprobs and all(lp.logprob <= 0 for lp in done.logprobs)
    assert "".join(lp.token for lp in done.logprobs).strip() == done.transcript.strip()


def _ulaw(x: int) -> int:
    """ITU-T G.711 mu-law encoding of one 16-bit sample (the test's own encoder)."""
    sign = 0x80 if x < 0 else 0
    x = min(abs(x), 32635) + 0x84
    exponent = max(0, x.bit_length() - 8)
    mantissa = (x >> (exponent + 3)) & 0x0F
    return ~(sign | (exponent << 4) | mantissa) & 0xFF


# ---- bad input: a clear error event each, and the session goes on


BAD_EVENTS = [
    ("not json", "invalid_json", None),
    ('["an", "array"]', "invalid_event", None),
    ('{"type": "response.create"}', "invalid_event_type", "type"),
    ('{"type": "input_audio_buffer.append"}', "invalid_value", "audio"),
    ('{"type": "input_audio_buffer.append", "audio": "%%%"}', "invalid_value", "audio"),
    ('{"type": "input_audio_buffer.append", "audio": "AAA=", "x": 1}', "invalid_value", "x"),
    ('{"type": "session.update", "session": {"type": "realtime"}}', "invalid_value",
     "session.type"),
    ('{"type": "session.update", "session": {"type": "transcription", "audio": {"input": '
     '{"format": {"type": "audio/wav"}}}}}', "invalid_value", "session.audio.input.format"),
    ('{"type": "session.update", "session": {"type": "transcription", "audio": {"input": '
     '{"format": {"type": "audio/pcm", "rate": 16000}}}}}', "invalid_value",
     "session.audio.input.format.rate"),
    ('{"type": "session.update", "session": {"type": "transcription", "audio": {"input": '
     '{"turn_detection": {"type": "server_vad", "threshold": 2}}}}}', "invalid_value",
     "session.audio.input.turn_detection.threshold"),
    ('{"type": "session.update", "session": {"type": "transcription", "audio": {"input": '
     '{"turn_detection": {"type": "semantic_vad"}}}}}', "unsupported_field",
     "session.audio.input.turn_detection.type"),
    ('{"type": "session.update", "session": {"type": "transcription", "audio": {"input": '
     '{"transcription": {"model": "gpt-9"}}}}}', "model_not_found",
     "session.audio.input.transcription.model"),
    ('{"type": "session.update", "session": {"type": "transcription", "voice": "alloy"}}',
     "invalid_value", "session.voice"),
    ('{"type": "session.update", "session": {"type": "transcription", "audio": {"input": '
     '{"noise_reduction": {"type": "near_field", "strength": 0.5}}}}}', "unsupported_field",
     "session.audio.input.noise_reduction.strength"),
    ('{"type": "session.update", "session": {"type": "transcription", "audio": {"input": '
     '{"transcription": {"delay": "low"}}}}}', "unsupported_field",
     "session.audio.input.transcription.delay"),
    ('{"type": "session.update", "session": {"type": "transcription", "include": '
     '["item.input_audio_transcription.logprobs"]}}', "unsupported_capability",
     "session.include"),  # the vLLM stand-in's pool has no logprobs
    ('{"type": "input_audio_buffer.commit"}', "input_audio_buffer_commit_empty", None),
]  # fmt: skip


def test_each_bad_event_gets_an_error_naming_it_and_the_session_goes_on(
    standin: tuple[Frontend, Behaviour], speech_dir: Path
) -> None:
    fe, _ = standin

    async def scenario() -> None:
        async with client(fe).realtime.connect(extra_query=INTENT) as conn:
            await until(conn, "session.created")
            for raw, code, param in BAD_EVENTS:
                await conn._connection.send(raw)  # as sent: the SDK would validate some
                (error,) = await until(conn, "error", seconds=10)
                assert (error.error.code, error.error.param) == (code, param), (raw, error)
                assert error.error.message
            # too large an append (the test's limit: 64 KiB), then a good turn
            big = base64.b64encode(bytes(70 * 1024)).decode()
            await conn.send({"type": "input_audio_buffer.append", "audio": big,
                             "event_id": "evt_big"})  # fmt: skip
            (error,) = await until(conn, "error", seconds=10)
            assert error.error.code == "append_too_large" and error.error.event_id == "evt_big"
            await conn.send({"type": "session.update", "session": MANUAL})
            await until(conn, "session.updated")
            await stream(conn, pcm(SENTENCES[0], speech_dir))
            await conn.send({"type": "input_audio_buffer.commit"})
            events = await until(conn, "conversation.item.done")
            assert any(e.type.endswith("transcription.completed") for e in events), events

    run(scenario())


def test_clear_drops_the_buffer(standin: tuple[Frontend, Behaviour], speech_dir: Path) -> None:
    fe, _ = standin

    async def scenario() -> None:
        async with client(fe).realtime.connect(extra_query=INTENT) as conn:
            await conn.send({"type": "session.update", "session": MANUAL})
            await until(conn, "session.updated")
            await stream(conn, silence(0.5))
            await conn.send({"type": "input_audio_buffer.clear"})
            await until(conn, "input_audio_buffer.cleared")
            await conn.send({"type": "input_audio_buffer.commit"})
            (error,) = [e for e in await until(conn, "error") if e.type == "error"]
            assert error.error.code == "input_audio_buffer_commit_empty"

    run(scenario())


# ---- before the upgrade: intent, keys, limits


def test_a_connection_without_the_transcription_intent_is_refused(
    standin: tuple[Frontend, Behaviour],
) -> None:
    fe, _ = standin
    status, _, body = refusal(ws_url(fe, "model=whisper-1"))
    assert status == 400 and body["error"]["param"] == "intent"
    status, _, body = refusal(ws_url(fe).replace("/v1/realtime", "/v1/elsewhere"))
    assert status == 404 and body["error"]["code"] == "unknown_url"
    status, _, body = refusal(ws_url(fe, "intent=transcription&model=gpt-9"))
    assert status == 404 and body["error"]["param"] == "model"


def test_keys_apply_to_the_websocket_header_and_subprotocol(
    worker: tuple[Running, Behaviour], tmp_path: Path
) -> None:
    keys = tmp_path / "keys"
    keys.write_text("sk-good\nsk-scoped other-model\n")
    table = RouteTable(model=PRIMARY, aliases=["whisper-1"], pools=[pool("batch", [worker[0].url])])
    fe = Frontend(table, keys=keys)
    try:
        status, _, body = refusal(ws_url(fe))
        assert status == 401 and body["error"]["code"] == "invalid_api_key"
        status, _, _ = refusal(ws_url(fe), additional_headers={"Authorization": "Bearer sk-bad"})
        assert status == 401
        status, _, body = refusal(ws_url(fe, "intent=transcription&model=whisper-1"),
                                   additional_headers={"Authorization": "Bearer sk-scoped"})  # fmt: skip
        assert status == 403
        # without a model: the one deployment's, which this key may not use either
        status, _, body = refusal(
            ws_url(fe), additional_headers={"Authorization": "Bearer sk-scoped"}
        )
        assert (status, body["error"]["code"]) == (403, "model_not_allowed")

        async def browser() -> str | None:  # the subprotocol browsers send
            protocols = ["realtime", "openai-insecure-api-key.sk-good"]
            async with websockets.connect(ws_url(fe), subprotocols=protocols) as ws:  # type: ignore[arg-type]
                created = server_event(await ws.recv())
                assert created.type == "session.created"
                return ws.subprotocol

        assert run(browser()) == "realtime"

        async def sdk() -> None:
            async with client(fe, "sk-good").realtime.connect(extra_query=INTENT) as conn:
                await until(conn, "session.created")

        run(sdk())
    finally:
        fe.running.stop()


def test_sessions_over_the_limit_are_refused_with_retry_after(
    standin: tuple[Frontend, Behaviour],
) -> None:
    fe, _ = standin  # two sessions at most
    refused = fe.metric("transcription_frontend_realtime_refused_total", reason="limit")

    async def scenario() -> tuple[int, dict[str, str]]:
        async with (
            client(fe).realtime.connect(extra_query=INTENT) as a,
            client(fe).realtime.connect(extra_query=INTENT) as b,
        ):
            await until(a, "session.created")
            await until(b, "session.created")
            assert fe.metric("transcription_frontend_realtime_sessions") == 2
            try:
                async with websockets.connect(ws_url(fe)):
                    raise AssertionError("a third session was accepted")
            except websockets.InvalidStatus as e:
                return e.response.status_code, dict(e.response.headers)

    status, headers = run(scenario())
    assert status == 503 and headers["retry-after"] == "1"
    assert fe.metric("transcription_frontend_realtime_refused_total", reason="limit") == refused + 1


def test_an_idle_session_is_told_and_closed(standin: tuple[Frontend, Behaviour]) -> None:
    fe, _ = standin  # idle timeout: 3 s

    async def scenario() -> None:
        async with websockets.connect(ws_url(fe)) as ws:
            assert server_event(await ws.recv()).type == "session.created"
            error = server_event(await asyncio.wait_for(ws.recv(), 10))
            assert error.type == "error" and error.error.code == "session_idle_timeout"
            with pytest.raises(websockets.ConnectionClosedOK):
                await asyncio.wait_for(ws.recv(), 10)

    run(scenario())
    assert fe.metric("transcription_frontend_realtime_sessions") == 0


# ---- turns that fail, and clients that vanish


def test_a_turn_whose_worker_fails_is_retried_elsewhere_or_fails_alone(
    worker: tuple[Running, Behaviour], speech_dir: Path
) -> None:
    b2 = Behaviour()
    with serve(vllm_app([PRIMARY, "whisper-1"], b2)) as second:
        table = RouteTable(model=PRIMARY, aliases=["whisper-1"],
                           pools=[pool("batch", [worker[0].url, second.url])])  # fmt: skip
        fe = Frontend(table)
        try:
            speech = pcm(SENTENCES[0], speech_dir)
            failed = fe.metric("transcription_frontend_realtime_turns_total", outcome="failed")
            retries = fe.metric("transcription_frontend_retries_total", pool="batch")

            async def turn(conn: Any) -> list[Any]:
                await stream(conn, speech)
                await conn.send({"type": "input_audio_buffer.commit"})
                return await until(conn, "conversation.item.done")

            async def scenario() -> None:
                async with client(fe).realtime.connect(extra_query=INTENT) as conn:
                    await conn.send({"type": "session.update", "session": MANUAL})
                    await until(conn, "session.updated")
                    # one is killed mid-turn (its connection cut before its first event)
                    worker[1].cut_stream_after = 0
                    for _ in range(4):
                        events = await turn(conn)
                        (done,) = [e for e in events if e.type.endswith("completed")]
                        assert done.transcript
                    assert worker[1].seen  # the killed one was tried, and replaced
                    worker[1].cut_stream_after = None
                    worker[1].status = b2.status = 500  # both fail: the turn fails alone
                    events = await turn(conn)
                    (failed,) = [e for e in events if e.type.endswith("transcription.failed")]
                    assert failed.error.message and failed.error.type
                    worker[1].status, b2.status = 503, None  # one refuses: retried on the other
                    for _ in range(4):
                        events = await turn(conn)
                        assert any(e.type.endswith("transcription.completed") for e in events)

            run(scenario())
            assert fe.metric("transcription_frontend_retries_total", pool="batch") >= retries + 1
            assert (
                fe.metric("transcription_frontend_realtime_turns_total", outcome="failed")
                == failed + 1
            )
        finally:
            fe.running.stop()


def test_a_client_that_vanishes_mid_turn_leaks_no_session_or_worker_request(
    standin: tuple[Frontend, Behaviour], speech_dir: Path
) -> None:
    fe, behaviour = standin
    behaviour.delay = 5.0  # the worker is slow: the client leaves while its turn decodes

    async def scenario() -> None:
        async with client(fe).realtime.connect(extra_query=INTENT) as conn:
            await conn.send({"type": "session.update", "session": MANUAL})
            await until(conn, "session.updated")
            await stream(conn, pcm(SENTENCES[0], speech_dir))
            await conn.send({"type": "input_audio_buffer.commit"})
            await until(conn, "conversation.item.added")
            for _ in range(3000):  # until the turn reaches the worker (60 s at most)
                if behaviour.in_flight:
                    break
                await asyncio.sleep(0.02)
            assert behaviour.in_flight, "the turn never reached the worker"

    run(scenario())
    assert run(_settle(fe, behaviour)), "a session or a worker request is still open"
    assert behaviour.cancelled == 1


async def _settle(fe: Frontend, worker: Behaviour) -> bool:
    for _ in range(600):  # 60 s at most: only a failure waits that long
        if fe.metric("transcription_frontend_realtime_sessions") == 0 and worker.in_flight == 0:
            return True
        await asyncio.sleep(0.1)
    return False


def test_http_still_serves_beside_sessions(standin: tuple[Frontend, Behaviour]) -> None:
    fe, _ = standin
    r = httpx.get(f"{fe.url}/v1/models")
    assert r.status_code == 200


# ---- the SDK's fields, each decided


def _paths(model: Any, prefix: str = "") -> set[str]:
    """Every field path of a pydantic model, through nested models and unions of them."""
    import typing

    from pydantic import BaseModel

    out: set[str] = set()
    for name, field in model.model_fields.items():
        path = prefix + name
        out.add(path)
        stack = [field.annotation]
        while stack:
            t = stack.pop()
            if isinstance(t, type) and issubclass(t, BaseModel):
                out |= _paths(t, path + ".")
            else:
                stack += typing.get_args(t)
    return out


def test_every_session_field_the_sdk_can_send_is_honoured_or_refused_by_name() -> None:
    """The installed SDK's transcription session: a field this gateway's model does not
    declare (honoured, or in REFUSED with its reason) fails here, on the SDK release that
    adds it; clients would otherwise get a generic error for it."""
    from openai.types.realtime import RealtimeTranscriptionSessionCreateRequest as SDK

    from transcription_api.realtime import REFUSED, TranscriptionSession

    ours = _paths(TranscriptionSession)
    undecided = _paths(SDK) - ours
    assert not undecided, f"decide on these realtime session fields: {sorted(undecided)}"
    assert {".".join(p) for p in REFUSED} <= ours


# ---- load and shutdown


def test_an_open_session_is_load_on_its_pool(standin: tuple[Frontend, Behaviour]) -> None:
    """KEDA's metric counts a session as soon as it opens: a pool at zero is woken before
    the first turn."""
    fe, _ = standin

    async def sessions(http: httpx.AsyncClient) -> int:
        r = await http.get(f"{fe.url}/internal/load")
        return int(r.json()["pools"]["batch"]["sessions"])

    async def scenario() -> tuple[int, int]:
        async with httpx.AsyncClient() as http:
            async with client(fe).realtime.connect(extra_query=INTENT) as conn:
                await until(conn, "session.created")
                during = await sessions(http)
            for _ in range(50):
                after = await sessions(http)
                if after == 0:
                    break
                await asyncio.sleep(0.1)
            return during, after

    assert run(scenario()) == (1, 0)


def test_sigterm_lets_a_turn_finish_then_closes_the_session_with_1001(
    tmp_path: Path, speech_dir: Path
) -> None:
    """A frontend rollout: the session's turn in progress is answered, then the session is
    closed with 1001 (going away), which the SDK reconnects from."""
    import signal

    from testkit.processes import frontend as frontend_process

    b = Behaviour(delay=1.5)
    with serve(vllm_app([PRIMARY, "whisper-1"], b)) as worker:
        table = RouteTable(
            model=PRIMARY, aliases=["whisper-1"], pools=[pool("batch", [worker.url])]
        )
        url, proc = frontend_process(table, tmp_path, shutdown_grace_seconds=10)
        try:

            async def scenario() -> tuple[list[str], int | None]:
                async with websockets.connect(url.replace("http", "ws") + "/v1/realtime?"
                                              "intent=transcription") as ws:  # fmt: skip
                    await ws.send(json.dumps({"type": "session.update", "session": MANUAL}))
                    for piece in appends(pcm(SENTENCES[0], speech_dir)):
                        await ws.send(json.dumps({"type": "input_audio_buffer.append",
                                                  "audio": piece}))  # fmt: skip
                    await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
                    kinds: list[str] = []
                    while "conversation.item.added" not in kinds:
                        kinds.append(server_event(await ws.recv()).type)
                    proc.send_signal(signal.SIGTERM)
                    try:
                        while True:
                            raw = await asyncio.wait_for(ws.recv(), 15)
                            kinds.append(server_event(raw).type)
                    except websockets.ConnectionClosed as e:
                        return kinds, e.rcvd.code if e.rcvd else None

            kinds, code = run(scenario())
            assert "conversation.item.input_audio_transcription.completed" in kinds, kinds
            assert kinds[-1] == "conversation.item.done" and code == 1001, (kinds, code)
            assert proc.wait(timeout=PATIENCE) in (0, -signal.SIGTERM)
        finally:
            proc.kill()

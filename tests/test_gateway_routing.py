"""Many deployments behind one frontend (a TranscriptionGateway's, reading `Routes`) over real
HTTP, with stand-in workers of two engines and the official SDK: each request goes to the
deployment that serves its model name, routed at the form's `model` field (before the file
when it comes first), and through that deployment's pools only; /v1/models; the 404s; keys
scoped to models; chat and realtime sessions by deployment; a deployment that leaves the
routes under load; upload limits; and the frontend's memory with a 20 MB file."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from testkit import host
from testkit.audio import tone_wav
from testkit.frontend import (
    AUDIO_LM_MODEL,
    FIXTURE_TEXT,
    PATIENCE,
    PRIMARY,
    WAV,
    Frontend,
    error,
    pool,
    wait_until,
)
from testkit.processes import frontend as frontend_process
from testkit.processes import stop
from testkit.realtime import appends, refusal, silence, until
from testkit.standins import (
    TRANSFORMERS,
    TRANSFORMERS_WHISPER,
    Behaviour,
    Running,
    recording,
    serve,
    transformers_app,
    vllm_app,
)
from transcription_api.capabilities import Engine, ModelFamily
from transcription_api.frontend import ChunkingSpec
from transcription_api.routes import RefusedDeployment, Routes, RouteTable
from transcription_frontend.audio.encode import wav

TINY = "openai/whisper-tiny.en"  # served by transformers (the worker knows it by its path)
QWEN = "Qwen/Qwen2-Audio-7B-Instruct"  # an audio language model: chat
TINY_TEXT = json.loads(recording(TRANSFORMERS, "json")[2])["text"]
COPYCAT = RefusedDeployment(
    deployment="speech/copycat", names=["copycat", "whisper-1"], reason="NameConflict",
    message="the name whisper-1 is already claimed by speech/whisper",
)  # fmt: skip
VALID = [PRIMARY, "whisper-1", TINY, "tiny", QWEN, "qwen"]
INTENT = {"intent": "transcription"}

Workers = dict[str, tuple[Running, Behaviour]]


def deployment(name: str, model: str, alias: str, url: str, **pool_fields: Any) -> RouteTable:
    """A deployment's table as a gateway's Routes carry it: its pool named `<name>/batch`."""
    p = pool(f"{name}/batch", [url]).model_copy(update=pool_fields)
    return RouteTable(model=model, aliases=[alias], namespace="speech",
                      deployment=f"speech/{name}", pools=[p])  # fmt: skip


def routes(workers: Workers, *names: str, **limits: int) -> Routes:
    tables = {
        "whisper": deployment("whisper", PRIMARY, "whisper-1", workers["whisper"][0].url),
        "tiny": deployment("tiny", TINY, "tiny", workers["tiny"][0].url,
                           engine=Engine.TRANSFORMERS, worker_model=TRANSFORMERS_WHISPER),
        "qwen": deployment("qwen", QWEN, "qwen", workers["qwen"][0].url,
                           engine=Engine.TRANSFORMERS, family=ModelFamily.AUDIO_LM,
                           worker_model=AUDIO_LM_MODEL),
    }  # fmt: skip
    chosen = [
        t.model_copy(update={"max_upload_bytes": limits.get(n, t.max_upload_bytes)})
        for n, t in tables.items()
        if n in (names or tables)
    ]
    return Routes(deployments=chosen, refused=[COPYCAT])


@pytest.fixture
def workers() -> Iterator[Workers]:
    """A vLLM stand-in (deployment whisper), transformers serving Whisper (tiny) and an audio
    language model (qwen)."""
    apps = {
        "whisper": lambda b: vllm_app([PRIMARY, "whisper-1"], b),
        "tiny": lambda b: transformers_app(b),
        "qwen": lambda b: transformers_app(b, model=AUDIO_LM_MODEL, family="audio-lm"),
    }
    with ExitStack() as stack:
        out = {}
        for name, app in apps.items():
            b = Behaviour()
            out[name] = (stack.enter_context(serve(app(b))), b)
        yield out


@pytest.fixture
def gateway(workers: Workers) -> Iterator[Frontend]:
    fe = Frontend(routes(workers))
    yield fe
    fe.running.stop()


def served(workers: Workers) -> dict[str, int]:
    return {name: len(b.seen) for name, (_, b) in workers.items()}


def audio_chat(model: str) -> dict[str, Any]:
    part = {"type": "input_audio",
            "input_audio": {"data": base64.b64encode(WAV).decode(), "format": "wav"}}  # fmt: skip
    return {"model": model, "messages": [{"role": "user", "content": [part]}]}


# ---- routing by name


def test_every_name_and_alias_transcribes_with_its_deployments_pools(
    gateway: Frontend, workers: Workers
) -> None:
    counted = gateway.metric("transcription_frontend_requests_total", model=TINY, pool="tiny/batch")
    for name, owner, text in [(PRIMARY, "whisper", FIXTURE_TEXT), ("whisper-1", "whisper", FIXTURE_TEXT),
                              (TINY, "tiny", TINY_TEXT), ("tiny", "tiny", TINY_TEXT)]:  # fmt: skip
        before = served(workers)
        r = gateway.client.audio.transcriptions.create(model=name, file=("a.wav", WAV))
        assert r.text == text, name
        assert served(workers) == {**before, owner: before[owner] + 1}, name
    # The transformers worker gets the name it loaded; metrics carry the primary and the pool.
    assert dict(workers["tiny"][1].seen[-1].fields)["model"] == TRANSFORMERS_WHISPER
    assert (
        gateway.metric("transcription_frontend_requests_total", model=TINY, pool="tiny/batch")
        == counted + 2
    )


def test_streams_come_from_each_deployment(gateway: Frontend, workers: Workers) -> None:
    for name, owner in [("whisper-1", "whisper"), ("tiny", "tiny")]:
        before = served(workers)
        events = list(gateway.client.audio.transcriptions.create(
            model=name, file=("a.wav", WAV), stream=True))  # fmt: skip
        assert events[-1].type == "transcript.text.done" and events[-1].text, name
        assert {e.type for e in events[:-1]} == {"transcript.text.delta"}, name
        assert served(workers) == {**before, owner: before[owner] + 1}, name


def test_chat_goes_to_the_audio_language_model_and_nowhere_else(
    gateway: Frontend, workers: Workers
) -> None:
    r = gateway.client.chat.completions.create(**audio_chat("qwen"))
    assert r.model == QWEN and r.choices[0].message.content
    assert workers["qwen"][1].seen[-1].body["model"] == AUDIO_LM_MODEL  # type: ignore[index]
    # A Whisper deployment's name: that deployment cannot chat, named.
    r2 = httpx.post(f"{gateway.url}/v1/chat/completions", json=audio_chat("whisper-1"), timeout=30)
    assert r2.status_code == 400
    assert error(r2)["message"] == (
        "no pool of deployment speech/whisper can serve this request: missing capability chat"
    )


def test_models_lists_every_deployments_names_owned_by_it(gateway: Frontend) -> None:
    listed = [(m.id, m.owned_by, m.root, m.parent) for m in gateway.client.models.list()]
    assert listed == [
        (PRIMARY, "speech/whisper", PRIMARY, None), ("whisper-1", "speech/whisper", PRIMARY, PRIMARY),
        (TINY, "speech/tiny", TINY, None), ("tiny", "speech/tiny", TINY, TINY),
        (QWEN, "speech/qwen", QWEN, None), ("qwen", "speech/qwen", QWEN, QWEN),
    ]  # fmt: skip


def test_unknown_refused_and_missing_models_say_what_is_valid(gateway: Frontend) -> None:
    r = gateway.post({"model": "nope"})
    assert r.status_code == 404
    assert (
        error(r)["message"] == f"The model `nope` does not exist. Valid models: {', '.join(VALID)}"
    )
    r = gateway.post({"model": "copycat"})
    assert r.status_code == 404 and error(r)["param"] == "model"
    assert error(r)["message"].startswith(
        "The model `copycat` is claimed by deployment speech/copycat, which this gateway does "
        "not route: the name whisper-1 is already claimed by speech/whisper (NameConflict)."
    )
    r = gateway.post({"language": "en"})  # no model: a gateway has no default
    assert r.status_code == 400 and error(r)["param"] == "model"
    assert error(r)["message"].endswith(f"Valid models: {', '.join(VALID)}")
    r = httpx.post(f"{gateway.url}/v1/chat/completions", json=audio_chat("nope"), timeout=30)
    assert r.status_code == 404 and "Valid models" in error(r)["message"]
    status, _, body = refusal(ws_url(gateway, "intent=transcription&model=copycat"))
    assert status == 404 and "speech/copycat" in body["error"]["message"]
    assert gateway.client.audio.transcriptions.create(model="tiny", file=("a.wav", WAV)).text


def test_a_gateway_routing_no_deployment_answers_404_with_the_reasons() -> None:
    fe = Frontend(Routes(refused=[COPYCAT]))
    try:
        assert fe.client.models.list().data == []
        r = fe.post({"model": "whisper-1"})
        assert r.status_code == 404
        assert error(r)["message"] == (
            "The model `whisper-1` does not exist: this gateway routes no deployment. Not "
            "routed: speech/copycat: the name whisper-1 is already claimed by speech/whisper "
            "(NameConflict)."
        )
        r = httpx.post(f"{fe.url}/v1/chat/completions", json=audio_chat("qwen"), timeout=30)
        assert r.status_code == 404
        status, _, _ = refusal(ws_url(fe, "intent=transcription&model=whisper-1"))
        assert status == 404
    finally:
        fe.running.stop()


# ---- keys scoped to models


def test_a_key_scoped_to_one_model_cannot_reach_the_other(workers: Workers, tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("sk-tiny tiny\n")
    fe = Frontend(routes(workers), keys=keys)
    auth = {"authorization": "Bearer sk-tiny"}
    try:
        client = openai.OpenAI(base_url=f"{fe.url}/v1", api_key="sk-tiny", max_retries=0)
        assert [m.id for m in client.models.list()] == [TINY, "tiny"]
        assert client.audio.transcriptions.create(model=TINY, file=("a.wav", WAV)).text == TINY_TEXT
        with pytest.raises(openai.PermissionDeniedError, match="may not use the model"):
            client.audio.transcriptions.create(model="whisper-1", file=("a.wav", WAV))
        # Refused at the field, before a large file after it is read.
        status, body = early_answer(fe.url, "whisper-1", headers=auth)
        assert status == 403 and json.loads(body)["error"]["code"] == "model_not_allowed"
        with pytest.raises(openai.PermissionDeniedError):
            client.chat.completions.create(**audio_chat("qwen"))
        # Realtime: refused at the upgrade, and in the session.
        status, _, body = refusal(ws_url(fe, "intent=transcription&model=whisper-1"),
                                  additional_headers=auth)  # fmt: skip
        assert status == 403 and body["error"]["code"] == "model_not_allowed"

        async def switch() -> Any:
            rt = openai.AsyncOpenAI(base_url=f"{fe.url}/v1", api_key="sk-tiny", max_retries=0)
            async with rt.realtime.connect(extra_query={**INTENT, "model": "tiny"}) as conn:
                await until(conn, "session.created")
                await conn.send({"type": "session.update", "session": session("whisper-1")})  # type: ignore[arg-type]
                return (await until(conn, "error", "session.updated"))[-1]

        event = asyncio.run(switch())
        assert event.type == "error" and event.error.code == "model_not_allowed"
    finally:
        fe.running.stop()


# ---- realtime


def ws_url(fe: Frontend, query: str) -> str:
    return fe.url.replace("http://", "ws://") + "/v1/realtime?" + query


def session(model: str) -> dict[str, Any]:
    return {"type": "transcription",
            "audio": {"input": {"turn_detection": None, "transcription": {"model": model}}}}  # fmt: skip


def test_a_realtime_session_transcribes_its_turns_with_its_deployments_pools(
    gateway: Frontend, workers: Workers
) -> None:
    async def turn(model: str) -> Any:
        rt = openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key="none", max_retries=0)
        async with rt.realtime.connect(extra_query=INTENT) as conn:
            await until(conn, "session.created")
            await conn.send({"type": "session.update", "session": session(model)})  # type: ignore[arg-type]
            await until(conn, "session.updated")
            for piece in appends(silence(0.5)):
                await conn.send({"type": "input_audio_buffer.append", "audio": piece})
            await conn.send({"type": "input_audio_buffer.commit"})
            events = await until(conn, "conversation.item.done")
            return next(e for e in events if e.type.endswith("transcription.completed"))

    for model, owner in [("whisper-1", "whisper"), ("tiny", "tiny")]:
        before = served(workers)
        completed = asyncio.run(turn(model))
        assert completed.transcript, model
        assert served(workers) == {**before, owner: before[owner] + 1}, model
        assert workers[owner][1].seen[-1].path == "/v1/audio/transcriptions"


# ---- routing before the file; the routes changing


def early_answer(url: str, model: str, headers: dict[str, str] | None = None,
                 file_bytes: int = 20 * 1024 * 1024) -> tuple[int, bytes]:  # fmt: skip
    """Send a form's head (the `model` field, then the first 64 KiB of a `file_bytes` file),
    stop sending, and read the answer: there is one only if the server answered before it
    read the file."""
    boundary = uuid.uuid4().hex
    head = (f'--{boundary}\r\nContent-Disposition: form-data; name="model"\r\n\r\n{model}\r\n'
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n'
            "Content-Type: audio/wav\r\n\r\n").encode()  # fmt: skip
    tail = f"\r\n--{boundary}--\r\n".encode()
    length = len(head) + file_bytes + len(tail)
    host_, port = url.removeprefix("http://").split(":")
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    with socket.create_connection((host_, int(port)), timeout=PATIENCE) as s:
        s.sendall((f"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: {host_}\r\n{extra}"
                   f"Content-Type: multipart/form-data; boundary={boundary}\r\n"
                   f"Content-Length: {length}\r\n\r\n").encode() + head + b"\0" * 65536)  # fmt: skip
        answer = b""
        while b"\r\n\r\n" not in answer or len(answer.split(b"\r\n\r\n", 1)[1]) < _length(answer):
            chunk = s.recv(65536)
            if not chunk:
                break
            answer += chunk
    status = int(answer.split(b" ", 2)[1])
    return status, answer.split(b"\r\n\r\n", 1)[1]


def _length(answer: bytes) -> int:
    head = answer.split(b"\r\n\r\n", 1)[0].decode("latin-1").lower()
    return next(
        int(line.split(":")[1]) for line in head.splitlines() if line.startswith("content-length")
    )


def test_an_unknown_model_before_a_large_file_is_refused_before_the_file_is_read(
    gateway: Frontend,
) -> None:
    status, body = early_answer(gateway.url, "nope")  # 64 KiB of the 20 MiB sent
    assert status == 404
    assert json.loads(body)["error"]["message"].endswith(f"Valid models: {', '.join(VALID)}")
    assert gateway.client.audio.transcriptions.create(model="tiny", file=("a.wav", WAV)).text


def test_a_deployments_lower_upload_limit_applies_to_what_is_routed_to_it(
    workers: Workers,
) -> None:
    fe = Frontend(routes(workers, tiny=64 * 1024))
    big = tone_wav(3)  # 94 KiB
    try:
        for order in ("before", "after"):
            r = post(fe.url, "tiny", big, order)
            assert r.status_code == 413, order
            assert error(r)["message"].startswith(
                "File too large: the upload limit of deployment speech/tiny is 65536 bytes"
            )
            assert post(fe.url, "whisper-1", big, order).status_code == 200, order
    finally:
        fe.running.stop()


def post(url: str, model: str, data: bytes, order: str) -> httpx.Response:
    """A transcription whose `model` field comes before or after its file."""
    parts: list[tuple[str, Any]] = [
        ("model", (None, model)),
        ("file", ("a.wav", data, "audio/wav")),
    ]
    if order == "after":
        parts.reverse()
    return httpx.post(f"{url}/v1/audio/transcriptions", files=parts, timeout=60)


def test_a_deployment_removed_under_load_fails_cleanly_and_the_other_keeps_serving(
    workers: Workers, tmp_path: Path
) -> None:
    workers["whisper"][1].delay = 0.3
    path = tmp_path / "routes.json"
    fe = Frontend(routes(workers), table_path=path)
    results: dict[str, list[tuple[float, int]]] = {"whisper-1": [], "tiny": []}
    done = threading.Event()

    def client(model: str) -> None:
        while not done.is_set():
            started = time.monotonic()
            r = fe.post({"model": model})
            results[model].append((started, r.status_code))

    def served() -> set[tuple[int, str]]:
        return {(status, m) for m, got in results.items() for _, status in list(got)}

    threads = [
        threading.Thread(target=client, args=(m,)) for m in ("whisper-1", "tiny") for _ in range(3)
    ]
    try:
        for t in threads:
            t.start()
        wait_until(lambda: (200, "whisper-1") in served(), what="whisper-1 served before it leaves")
        new = tmp_path / "routes.new"
        new.write_text(routes(workers, "tiny", "qwen").dumps())
        os.replace(new, path)  # as kubelet swaps a ConfigMap's files
        wait_until(lambda: "whisper-1" not in [m.id for m in fe.client.models.list()],
                   what="the new routes read")  # fmt: skip
        removed = time.monotonic()
        wait_until(lambda: len([t for t, _ in results["whisper-1"] if t > removed]) >= 3
                   and len(results["tiny"]) > 6, what="requests sent after the removal")  # fmt: skip
    finally:
        done.set()
        for t in threads:
            t.join(30)
        fe.running.stop()
    whisper = [status for _, status in results["whisper-1"]]
    assert set(whisper) <= {200, 404, 503} and 200 in whisper and 404 in whisper, whisper
    assert {status for started, status in results["whisper-1"] if started > removed} == {404}
    assert {status for _, status in results["tiny"]} == {200}
    assert len(results["tiny"]) > 6


def test_a_request_held_for_a_deployment_that_leaves_the_routes_gets_503_at_once(
    workers: Workers, tmp_path: Path
) -> None:
    gone = routes(workers, "whisper", "tiny")
    idle = gone.deployments[0].model_copy(
        update={"pools": [gone.deployments[0].pools[0].model_copy(update={"endpoints": []})]}
    )  # no ready worker: its requests are held (scale from zero)
    path = tmp_path / "routes.json"
    fe = Frontend(gone.model_copy(update={"deployments": [idle, gone.deployments[1]]}),
                  table_path=path)  # fmt: skip
    answer: list[httpx.Response] = []
    try:
        held = threading.Thread(target=lambda: answer.append(fe.post({"model": "whisper-1"})))
        held.start()
        time.sleep(0.5)
        assert not answer
        new = tmp_path / "routes.new"
        new.write_text(routes(workers, "tiny").dumps())
        os.replace(new, path)
        held.join(10)  # the table is re-read every 2 s; a hold lasts 30 s by default
        assert answer and answer[0].status_code == 503
        assert "left the frontend's route table" in error(answer[0])["message"]
    finally:
        fe.running.stop()


# ---- memory: the frontend's process with a 20 MB file, `model` before and after it


def test_model_before_and_after_a_20_mb_file_is_routed_without_holding_it_in_memory(
    tmp_path: Path,
) -> None:
    with ExitStack() as stack:
        b = {name: Behaviour() for name in ("whisper", "distil")}
        urls = {
            "whisper": stack.enter_context(serve(vllm_app([PRIMARY, "whisper-1"], b["whisper"]))).url,
            "distil": stack.enter_context(serve(vllm_app(["distil-large-v3", "distil"], b["distil"]))).url,
        }  # fmt: skip
        two = Routes(deployments=[
            deployment("whisper", PRIMARY, "whisper-1", urls["whisper"]),
            deployment("distil", "distil-large-v3", "distil", urls["distil"]),
        ])  # fmt: skip
        # 20 MiB of WAV is 11 minutes: sent whole, not chunked, to see the upload's memory.
        url, proc = frontend_process(two, tmp_path, chunking=ChunkingSpec(enabled=False))
        stack.callback(stop, proc)

        def peak_growth(size: int) -> int:
            """How far the frontend's resident memory peaked above where it was (KiB) while
            it served one upload of `size` bytes with `model` before it, one after."""
            data = wav(bytes(size - 44), 16000)
            Path(f"/proc/{proc.pid}/clear_refs").write_text("5")  # VmHWM := VmRSS
            rss = host.status_kib(proc.pid, "VmRSS")
            for model, order in [("distil", "before"), ("whisper-1", "after")]:
                r = post(url, model, data, order)
                assert r.status_code == 200, (order, r.text)
            return host.status_kib(proc.pid, "VmHWM") - rss

        peak_growth(1024 * 1024)  # warm: every code path loaded once
        small = peak_growth(1024 * 1024)
        large = peak_growth(20 * 1024 * 1024)
        # Each stand-in got its whole file, by the name the form gave.
        assert [s.file_bytes for s in b["distil"].seen] == [
            1024 * 1024,
            1024 * 1024,
            20 * 1024 * 1024,
        ]
        assert [s.file_bytes for s in b["whisper"].seen] == [
            1024 * 1024,
            1024 * 1024,
            20 * 1024 * 1024,
        ]
        print(f"frontend peak RSS growth: 1 MiB uploads {small} KiB, 20 MiB uploads {large} KiB")
        # Held whole, two 20 MiB uploads would add 20 MiB at least; spooled, about nothing.
        assert large < small + 8 * 1024, (small, large)

"""The gateway against stand-in vLLM workers replaying vLLM's recorded answers, over real
HTTP, with the official OpenAI client as the client."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from testkit.frontend import (
    FIXTURE_TEXT,
    PATIENCE,
    PRIMARY,
    SERVED,
    WAV,
    Frontend,
    assert_still_serving,
    error,
    pool,
    sse_events,
    wait_until,
)
from testkit.host import free_port
from testkit.longaudio import bursts
from testkit.standins import (
    TRANSFORMERS,
    VLLM,
    Behaviour,
    Running,
    recording,
    serve,
    start,
    vllm_app,
)
from transcription_api.capabilities import Engine, Mode
from transcription_api.frontend import ChunkingSpec, HoldLimits
from transcription_api.routes import RouteTable
from transcription_frontend import forward, routing

# --------------------------------------------------------------------------- formats


def test_json_through_the_openai_client(
    frontend: Frontend, worker: tuple[Running, Behaviour]
) -> None:
    r = frontend.client.audio.transcriptions.create(model="whisper-1", file=("a.wav", WAV))
    assert r.text == FIXTURE_TEXT
    # The alias reached the worker as the primary name.
    assert dict(worker[1].seen[-1].fields)["model"] == PRIMARY


def test_text_is_plain_text_although_vllm_answers_json(frontend: Frontend) -> None:
    r = frontend.post({"model": "whisper-1", "response_format": "text"})
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    assert r.text == FIXTURE_TEXT.strip() + "\n"
    sdk = frontend.client.audio.transcriptions.create(
        model="whisper-1", file=("a.wav", WAV), response_format="text"
    )
    assert sdk.strip() == FIXTURE_TEXT.strip()


@pytest.mark.parametrize("fmt", ["srt", "vtt"])
def test_srt_and_vtt_are_rendered_from_segments(
    frontend: Frontend, worker: tuple[Running, Behaviour], fmt: str
) -> None:
    worker[1].segments = True
    out = frontend.client.audio.transcriptions.create(
        model="whisper-1", file=("a.wav", WAV), response_format=fmt
    )  # type: ignore[call-overload]
    assert dict(worker[1].seen[-1].fields)["response_format"] == "verbose_json"
    if fmt == "srt":
        assert out.startswith(
            "1\n00:00:00,000 --> 00:00:03,200\nThe quick roundfoc stump over the lazy dog.\n\n2\n00:00:03,200 --> 00:00:06,800\n"
        )
    else:
        assert out.startswith(
            "WEBVTT\n\n00:00:00.000 --> 00:00:03.200\nThe quick roundfoc stump over the lazy dog.\n"
        )


def test_verbose_json_passes_through(frontend: Frontend, worker: tuple[Running, Behaviour]) -> None:
    worker[1].segments = True
    r = frontend.client.audio.transcriptions.create(
        model="whisper-1", file=("a.wav", WAV), response_format="verbose_json"
    )
    assert r.language == "en"
    assert r.duration == pytest.approx(6.81675)
    assert r.segments is not None and [s.end for s in r.segments] == [3.2, 6.8]


def test_each_endpoint_reaches_the_same_endpoint_of_the_worker(
    frontend: Frontend, worker: tuple[Running, Behaviour]
) -> None:
    r = frontend.client.audio.translations.create(model="whisper-1", file=("a.wav", WAV))
    assert r.text == FIXTURE_TEXT
    assert worker[1].seen[-1].path == "/v1/audio/translations"
    frontend.client.audio.transcriptions.create(model="whisper-1", file=("a.wav", WAV))
    assert worker[1].seen[-1].path == "/v1/audio/transcriptions"


def test_stream_is_translated_to_openai_events_as_they_arrive(
    frontend: Frontend, worker: tuple[Running, Behaviour]
) -> None:
    worker[1].chunk_delay = 0.05
    events: list[tuple[float, Any]] = []
    start_t = time.monotonic()
    stream = frontend.client.audio.transcriptions.create(
        model="whisper-1", file=("a.wav", WAV), stream=True
    )
    for event in stream:
        events.append((time.monotonic() - start_t, event))
    deltas = [e for _, e in events if e.type == "transcript.text.delta"]
    done = [e for _, e in events if e.type == "transcript.text.done"]
    assert len(done) == 1 and events[-1][1].type == "transcript.text.done"
    assert "".join(d.delta for d in deltas) == done[0].text == FIXTURE_TEXT
    # A duration-billed model's usage: the 0.5 s upload's header, rounded up (the engine
    # counted 709 tokens, which the client is not billed for).
    assert done[0].usage is not None and done[0].usage.type == "duration"
    assert done[0].usage.seconds == 1
    # Forwarded as they arrive: the first delta came long before the last.
    assert events[-1][0] - events[0][0] > 0.5
    fields = dict(worker[1].seen[-1].fields)
    assert fields["stream"] == "true" and fields["stream_include_usage"] == "true"


def test_a_worker_failing_mid_stream_reaches_the_client_as_an_error(
    frontend: Frontend, worker: tuple[Running, Behaviour]
) -> None:
    """vLLM ends a failed stream with an error event (then [DONE]): the client must get an
    error, never a `transcript.text.done` with the partial text."""
    worker[1].fail_stream_after = 2
    errors = frontend.metric("transcription_frontend_requests_total", status="502")
    r = frontend.post({"model": "whisper-1", "stream": "true"})
    assert r.status_code == 200  # the stream had begun
    events = sse_events(r)
    assert [e["type"] for e in events] == ["transcript.text.delta"] * 2 + ["error"]
    err = events[-1]["error"]
    assert err["type"] == "server_error" and err["code"] == "worker_error"
    assert err["message"].startswith(
        "the vllm worker of pool batch failed to process the request (mid-stream: EngineCore encountered an issue"
    )
    # The OpenAI SDK raises it, after the deltas that did arrive.
    stream = frontend.client.audio.transcriptions.create(
        model="whisper-1", file=("a.wav", WAV), stream=True
    )
    got: list[str] = []

    def consume() -> None:
        got.extend(event.type for event in stream)

    with pytest.raises(openai.APIError, match="failed to process the request"):
        consume()
    assert got == ["transcript.text.delta"] * 2
    assert frontend.metric("transcription_frontend_requests_total", status="502") == errors + 2
    worker[1].fail_stream_after = None
    assert_still_serving(frontend)


def test_a_worker_stream_that_breaks_off_is_an_error_too(
    frontend: Frontend, worker: tuple[Running, Behaviour], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stream that stops without vLLM's closing `[DONE]` did not finish."""
    body = recording(VLLM, "stream")[2]
    truncated = body[: body.index("data: [DONE]")]
    monkeypatch.setattr(
        "testkit.standins.recording",
        lambda d, n: (200, "text/event-stream", truncated) if n == "stream" else recording(d, n),
    )
    events = sse_events(frontend.post({"model": "whisper-1", "stream": "true"}))
    assert events[-1]["type"] == "error" and all(
        e["type"] != "transcript.text.done" for e in events
    )
    assert "its stream ended before the transcript did" in events[-1]["error"]["message"]


def test_no_field_is_dropped(frontend: Frontend, worker: tuple[Running, Behaviour]) -> None:
    """OpenAI's fields the gateway honours, and an engine's own (vLLM's `seed`,
    `to_language`), reach the worker as sent; OpenAI's fields no engine honours are refused
    by name (tests/test_fields.py)."""
    sent = [
        ("model", "whisper-1"), ("language", "en"), ("prompt", "Kubernetes, vLLM."),
        ("temperature", "0.2"), ("response_format", "json"), ("timestamp_granularities[]", "segment"),
        ("seed", "7"), ("to_language", "en"),
    ]  # fmt: skip
    r = frontend.post(sent + [("response_format", "verbose_json")][:0])
    assert r.status_code == 400  # granularities need verbose_json: checked before forwarding
    sent[4] = ("response_format", "verbose_json")
    r = frontend.post(sent)
    assert r.status_code == 200, r.text
    seen = worker[1].seen[-1]
    assert seen.fields == [(k, PRIMARY if k == "model" else v) for k, v in sent]
    assert seen.file_bytes == len(WAV) and seen.file_name == "a.wav"


def test_request_id_is_forwarded_and_returned(
    frontend: Frontend, worker: tuple[Running, Behaviour]
) -> None:
    r = frontend.post({"model": "whisper-1"}, headers={"x-request-id": "abc-123"})
    assert r.headers["x-request-id"] == "abc-123"
    assert worker[1].seen[-1].headers["x-request-id"] == "abc-123"
    generated = frontend.post({"model": "whisper-1"}).headers["x-request-id"]
    assert len(generated) == 32


# --------------------------------------------------------------------------- errors


BAD_INPUTS = [
    ({"model": "nope"}, WAV, 404, "The model `nope` does not exist. Valid models: openai/whisper-large-v3-turbo, whisper-1"),
    ({"model": "whisper-1"}, None, 400, "the `file` part is missing"),
    ({"model": "whisper-1"}, b"", 400, "the uploaded file is empty"),
    ({"model": "whisper-1"}, b"\x00garbage" * 100, 400, "not a recognised audio"),
    ({"model": "whisper-1", "temperature": "abc"}, WAV, 400, "temperature must be a number between 0 and 1, got 'abc'"),
    ({"model": "whisper-1", "temperature": "5"}, WAV, 400, "temperature must be a number between 0 and 1, got '5'"),
    ({"model": "whisper-1", "language": "english!"}, WAV, 400, "language must be an ISO-639-1 code"),
    ({"model": "whisper-1", "language": "xx"}, WAV, 400, "Unsupported language: 'xx'"),  # vLLM's own check
    ({"model": "whisper-1", "response_format": "docx"}, WAV, 400, "response_format must be one of json, text, srt, vtt, verbose_json"),
    ({"model": "whisper-1", "stream": "maybe"}, WAV, 400, "stream must be true or false"),
    ({"model": "whisper-1", "stream": "true", "response_format": "verbose_json"}, WAV, 400, "stream=true is supported with response_format json or text"),
    ({"model": "whisper-1", "response_format": "verbose_json", "timestamp_granularities[]": "word"}, WAV, 400, "missing capability word_timestamps"),
    ({"model": "whisper-1", "timestamp_granularities[]": "minute", "response_format": "verbose_json"}, WAV, 400, "timestamp_granularities[] values must be word or segment"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("fields", "file", "status", "message"), BAD_INPUTS, ids=[m[:40] for *_, m in BAD_INPUTS]
)
def test_bad_input_gets_a_clear_error_and_the_server_keeps_serving(
    frontend: Frontend, fields: dict[str, str], file: bytes | None, status: int, message: str
) -> None:
    r = frontend.post(fields, file)
    assert r.status_code == status, r.text
    assert message in error(r)["message"]
    assert_still_serving(frontend)


def test_errors_reach_the_openai_client_as_its_exceptions(frontend: Frontend) -> None:
    with pytest.raises(openai.NotFoundError) as nf:
        frontend.client.audio.transcriptions.create(model="nope", file=("a.wav", WAV))
    assert nf.value.body["param"] == "model"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError):
        frontend.client.audio.transcriptions.create(
            model="whisper-1", file=("a.wav", b"not audio at all")
        )


def test_not_multipart_is_refused_as_openai_does(frontend: Frontend) -> None:
    # OpenAI answers a wrong content type with 400 (not 415), which OpenAI clients handle.
    r = httpx.post(f"{frontend.url}/v1/audio/transcriptions", json={"model": "whisper-1"})
    assert r.status_code == 400
    e = error(r)
    assert (e["type"], e["code"]) == ("invalid_request_error", "unsupported_content_type")
    assert "multipart/form-data" in e["message"] and "application/json" in e["message"]
    r = httpx.post(
        f"{frontend.url}/v1/audio/transcriptions",
        content=b"--x\r\nbroken",
        headers={"content-type": "multipart/form-data; boundary=x"},
    )
    assert r.status_code == 400
    assert_still_serving(frontend)


def test_oversize_upload_gets_413_naming_the_limit(worker: tuple[Running, Behaviour]) -> None:
    table = RouteTable(
        model=PRIMARY,
        aliases=["whisper-1"],
        pools=[pool("batch", [worker[0].url])],
        max_upload_bytes=1024 * 1024,
    )
    fe = Frontend(table)
    try:
        big = b"RIFF" + b"\x00" * (2 * 1024 * 1024)
        r = fe.post({"model": "whisper-1"}, big)  # with Content-Length: refused before reading
        assert r.status_code == 413
        assert error(r)["message"].startswith(
            "File too large: the upload limit is 1048576 bytes (1.0 MiB)"
        )

        def chunked() -> Iterator[bytes]:  # no Content-Length: refused when the limit is crossed
            yield b'--b\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\nRIFF'
            for _ in range(64):
                yield b"\x00" * 65536
            yield b"\r\n--b--\r\n"

        r = httpx.post(
            f"{fe.url}/v1/audio/transcriptions",
            content=chunked(),
            headers={"content-type": "multipart/form-data; boundary=b"},
        )
        assert r.status_code == 413
        assert worker[1].seen == []  # nothing reached the worker
        assert_still_serving(fe)
    finally:
        fe.running.stop()


def test_files_over_vllms_cap_are_413_not_vllms_400(worker: tuple[Running, Behaviour]) -> None:
    """Without chunking; with it (the default) such a file is cut into pieces vLLM takes."""
    table = RouteTable(
        model=PRIMARY,
        aliases=["whisper-1"],
        pools=[pool("batch", [worker[0].url])],
        max_upload_bytes=64 * 1024 * 1024,
    )
    fe = Frontend(table, chunking=ChunkingSpec(enabled=False))
    try:
        r = fe.post({"model": "whisper-1"}, b"RIFF" + b"\x00" * (26 * 1024 * 1024))
        assert r.status_code == 413
        assert "25 MiB" in error(r)["message"]
    finally:
        fe.running.stop()


def test_files_over_vllms_cap_are_chunked(worker: tuple[Running, Behaviour]) -> None:
    """A 26 MiB WAV (14 minutes), over vLLM's 25 MiB: its chunks each fit."""
    table = RouteTable(model=PRIMARY, aliases=["whisper-1"], pools=[pool("batch", [worker[0].url])],
                       max_upload_bytes=64 * 1024 * 1024)  # fmt: skip
    fe = Frontend(table)
    try:
        audio = bursts(852)
        assert len(audio) > 26 * 1024 * 1024
        r = fe.post({"model": "whisper-1"}, audio, timeout=300)
        assert r.status_code == 200, r.text
        seen = worker[1].seen
        assert len(seen) >= 852 // 30 and all(s.file_bytes < 25 * 1024 * 1024 for s in seen)
        assert r.json()["usage"] == {"type": "duration", "seconds": 852}
    finally:
        fe.running.stop()


def test_api_keys(worker: tuple[Running, Behaviour], tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("k-one\nk-two\n")
    table = RouteTable(model=PRIMARY, aliases=["whisper-1"], pools=[pool("batch", [worker[0].url])])
    fe = Frontend(table, keys=keys)
    try:
        r = fe.post({"model": "whisper-1"})
        assert r.status_code == 401 and "Missing API key" in error(r)["message"]
        r = fe.post({"model": "whisper-1"}, headers={"authorization": "Bearer wrong"})
        assert r.status_code == 401 and error(r)["code"] == "invalid_api_key"
        with pytest.raises(openai.AuthenticationError):
            fe.client.audio.transcriptions.create(model="whisper-1", file=("a.wav", WAV))
        ok = openai.OpenAI(base_url=f"{fe.url}/v1", api_key="k-two", max_retries=0)
        assert (
            ok.audio.transcriptions.create(model="whisper-1", file=("a.wav", WAV)).text
            == FIXTURE_TEXT
        )
        assert [m.id for m in ok.models.list()] == SERVED
    finally:
        fe.running.stop()


def test_all_workers_busy_is_503_with_retry_after() -> None:
    busy = Behaviour(status=503)
    with serve(vllm_app(SERVED, busy)) as overloaded:
        fe = Frontend(RouteTable(model=PRIMARY, pools=[pool("batch", [overloaded.url])]))
        try:
            r = fe.post({"model": PRIMARY})
            assert r.status_code == 503 and r.headers["retry-after"] == "5"
            assert "no worker could take the request (pools: batch)" in error(r)["message"]
            assert "is overloaded (503)" in error(r)["message"]
        finally:
            fe.running.stop()


# --------------------------------------------------------------------------- endpoints


def test_models_health_ready_metrics(frontend: Frontend) -> None:
    models = frontend.client.models.list()
    assert [(m.id, m.owned_by) for m in models] == [
        (PRIMARY, "transcription-operator"),
        ("whisper-1", "transcription-operator"),
    ]
    assert httpx.get(f"{frontend.url}/health").json() == {"status": "ok"}
    assert httpx.get(f"{frontend.url}/ready").json() == {"status": "ready"}
    ok = {"model": PRIMARY, "status": "200", "pool": "batch"}
    missing = {"model": "unknown", "status": "404", "pool": "none"}
    before = [
        frontend.metric("transcription_frontend_requests_total", **labels)
        for labels in (ok, missing)
    ]
    uploads = frontend.metric(
        "transcription_frontend_upload_bytes_count", endpoint="transcriptions"
    )
    frontend.client.audio.transcriptions.create(model="whisper-1", file=("a.wav", WAV))
    frontend.post({"model": "nope"})
    # Counted under the primary model name, though the client sent the alias.
    assert frontend.metric("transcription_frontend_requests_total", **ok) == before[0] + 1
    assert frontend.metric("transcription_frontend_requests_total", **missing) == before[1] + 1
    # The unknown model is refused at its field, before its file is read: no upload counted.
    assert (
        frontend.metric("transcription_frontend_upload_bytes_count", endpoint="transcriptions")
        == uploads + 1
    )


def test_openapi_document_describes_the_form(frontend: Frontend) -> None:
    doc = httpx.get(f"{frontend.url}/openapi.json").json()
    body = doc["paths"]["/v1/audio/transcriptions"]["post"]["requestBody"]["content"][
        "multipart/form-data"
    ]
    assert body["schema"]["required"] == ["file"]
    # Derived from the request model the gateway parses with: every field, as clients name it.
    from transcription_api.openai import TranscriptionRequest

    fields = {f.alias or n for n, f in TranscriptionRequest.model_fields.items()}
    props = body["schema"]["properties"]
    assert set(props) == {"file"} | fields and "timestamp_granularities[]" in props
    assert props["response_format"]["enum"] == ["json", "text", "srt", "vtt", "verbose_json",
                                                "diarized_json"]  # fmt: skip
    assert props["temperature"] == {
        "type": "number",
        "minimum": 0.0,
        "maximum": 1.0,
        "default": 0.0,
        "description": "Sampling temperature.",
    }


# --------------------------------------------------------------------------- routing


def test_capability_choice_and_fallback_to_sequential() -> None:
    b_fast, b_words = Behaviour(), Behaviour()
    with serve(vllm_app(SERVED, b_fast)) as fast, serve(vllm_app(SERVED, b_words)) as words:
        table = RouteTable(model=PRIMARY, pools=[
            pool("batch", [fast.url]),
            pool("words", [words.url], engine=Engine.FASTER_WHISPER, mode=Mode.SEQUENTIAL),
        ])  # fmt: skip
        fe = Frontend(table)
        try:
            fe.post({"model": PRIMARY})
            assert (len(b_fast.seen), len(b_words.seen)) == (1, 0)  # continuous first
            fe.post(
                [
                    ("model", PRIMARY),
                    ("response_format", "verbose_json"),
                    ("timestamp_granularities[]", "word"),
                ]
            )
            assert (len(b_fast.seen), len(b_words.seen)) == (1, 1)  # only faster-whisper has words
            # faster-whisper renders srt itself: it is asked for srt, not verbose_json.
            fe.router.set_endpoints("batch", [])
            fe.post({"model": PRIMARY, "response_format": "srt"})
            assert dict(b_words.seen[-1].fields)["response_format"] == "srt"
        finally:
            fe.running.stop()


def test_retry_on_a_dead_endpoint_then_ejection_and_recovery(
    worker: tuple[Running, Behaviour], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(routing, "EJECT_SECONDS", 2.0)
    dead = "http://127.0.0.1:9"  # nothing listens on the discard port
    table = RouteTable(model=PRIMARY, pools=[pool("batch", [dead, worker[0].url])])
    fe = Frontend(table)
    try:
        retries = fe.metric("transcription_frontend_retries_total", pool="batch")
        ejections = fe.metric("transcription_frontend_endpoint_ejections_total", pool="batch")
        # Equal load: the endpoint used least recently (the dead one) is tried first,
        # fails, and the request is retried on the live one.
        for _ in range(routing.EJECT_AFTER):
            assert fe.post({"model": PRIMARY}).status_code == 200
        assert dead not in fe.router.ready("batch")
        assert (
            fe.metric("transcription_frontend_retries_total", pool="batch")
            >= retries + routing.EJECT_AFTER
        )
        assert (
            fe.metric("transcription_frontend_endpoint_ejections_total", pool="batch")
            == ejections + 1
        )
        time.sleep(2.1)
        assert dead in fe.router.ready("batch")  # back in rotation after the ejection period
    finally:
        fe.running.stop()


def test_a_worker_not_reachable_yet_is_tried_again_until_it_is(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A pod can be Ready before the pod network lets the gateway reach it (its
    NetworkPolicy rules programmed seconds later): refused connections cost no attempt, and
    the request is tried again (held through the endpoint's ejection, then with a backoff)
    until the worker answers."""
    monkeypatch.setattr(routing, "EJECT_SECONDS", 1.0)
    port = free_port()
    behaviour = Behaviour()
    later: list[Running] = []
    fe = Frontend(RouteTable(model=PRIMARY, pools=[pool("batch", [f"http://127.0.0.1:{port}"])]))
    try:
        retries = fe.metric("transcription_frontend_retries_total", pool="batch")

        def tried() -> float:
            return fe.metric("transcription_frontend_retries_total", pool="batch") - retries

        with ThreadPoolExecutor(1) as ex:
            answer = ex.submit(fe.post, {"model": PRIMARY})
            # More refusals than MAX_ATTEMPTS (EJECT_AFTER, then more after the ejection),
            # and the request still waits: only then does the worker come up.
            wait_until(lambda: tried() > forward.MAX_ATTEMPTS, timeout=60,
                       what=f"over {forward.MAX_ATTEMPTS} refused attempts")  # fmt: skip
            assert not answer.done(), answer.result()
            later.append(start(vllm_app(SERVED, behaviour), port))
            r = answer.result(timeout=60)
        assert r.status_code == 200, r.text
        assert len(behaviour.seen) == 1
    finally:
        fe.running.stop()
        for running in later:
            running.stop()


class _LaggingClock:
    """The router's clock, which a test sets behind the real one (and the event loop's)."""

    def __init__(self) -> None:
        self.lag = 0.0

    def monotonic(self) -> float:
        return time.monotonic() - self.lag


def test_a_request_held_through_an_ejection_is_served_when_it_ends_even_if_woken_early(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A request that comes while the pool's only endpoint is ejected is held. The
    ejection's end wakes it by a timer on the event loop's clock; should that fire just
    before the ejection has ended by the router's clock (here the router's clock runs 0.3 s
    behind once the endpoint is ejected), the request finds it still ejected. It is held
    again until the ejection ends by the router's clock, and served then. Before, nothing
    woke it again: 503 at the hold's timeout, as a request in CI's e2e suite got after
    300 s while its pool served the others."""
    monkeypatch.setattr(routing, "EJECT_SECONDS", 1.0)
    clock = _LaggingClock()
    monkeypatch.setattr(routing, "time", clock)
    port = free_port()
    behaviour = Behaviour()
    later: list[Running] = []
    table = RouteTable(model=PRIMARY, aliases=["whisper-1"],
                       pools=[pool("batch", [f"http://127.0.0.1:{port}"])])  # fmt: skip
    fe = Frontend(table, hold=HoldLimits(timeout_seconds=10))
    try:
        ejections = fe.metric("transcription_frontend_endpoint_ejections_total", pool="batch")
        with ThreadPoolExecutor(2) as ex:
            first = ex.submit(fe.post, {"model": PRIMARY})  # refused until ejected
            wait_until(lambda: fe.metric("transcription_frontend_endpoint_ejections_total",
                                         pool="batch") > ejections, what="the endpoint ejected")  # fmt: skip
            clock.lag = 0.3
            later.append(start(vllm_app(SERVED, behaviour), port))  # reachable from now on
            held = ex.submit(fe.post, {"model": PRIMARY})
            r = held.result(timeout=PATIENCE)
            assert r.status_code == 200, r.text
            assert first.result(timeout=PATIENCE).status_code == 200
        assert len(behaviour.seen) == 2
        assert_still_serving(fe)
    finally:
        fe.running.stop()
        for running in later:
            running.stop()


def test_a_worker_never_reachable_is_503_naming_it_once_the_bound_passes(
    worker: tuple[Running, Behaviour], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(forward, "UNREACHED_SECONDS", 1.0)
    dead = "http://127.0.0.1:9"  # nothing listens on the discard port
    fe = Frontend(RouteTable(model=PRIMARY, pools=[pool("batch", [dead])]))
    try:
        started = time.monotonic()
        r = fe.post({"model": PRIMARY})
        assert r.status_code == 503 and r.headers["retry-after"] == "5"
        assert time.monotonic() - started >= 1.0  # not before the bound
        assert error(r)["message"] == (
            "no worker could take the request (pools: batch): a worker of pool batch could "
            "not be reached (ClientConnectorError), for 1 s"
        )
        # The gateway serves on once the pool has a worker it can reach.
        fe.router.set_endpoints("batch", [worker[0].url])
        assert fe.post({"model": PRIMARY}).status_code == 200
    finally:
        fe.running.stop()


def test_an_unreachable_worker_that_discovery_removes_is_waited_for_like_any_hold(
    worker: tuple[Running, Behaviour], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker killed: its connection refused, then its endpoint gone. The request is held
    for a new one past UNREACHED_SECONDS, as any held request (a new pod may take long)."""
    monkeypatch.setattr(forward, "UNREACHED_SECONDS", 0.5)
    dead = "http://127.0.0.1:9"
    fe = Frontend(RouteTable(model=PRIMARY, pools=[pool("batch", [dead])]))
    try:
        with ThreadPoolExecutor(1) as ex:
            answer = ex.submit(fe.post, {"model": PRIMARY})
            wait_until(lambda: fe.gateway.holds.held("batch") == 1, timeout=30,
                       what="the request held on the refused worker")  # fmt: skip
            fe.endpoints("batch", [])  # the pod is gone
            time.sleep(3 * forward.UNREACHED_SECONDS)  # at least: the bound is long past
            assert not answer.done(), answer.result()  # still held, not failed at the bound
            assert fe.gateway.holds.held("batch") == 1
            fe.endpoints("batch", [worker[0].url])  # its successor
            r = answer.result(timeout=30)
        assert r.status_code == 200, r.text
    finally:
        fe.running.stop()


def test_worker_503_is_retried_on_another_endpoint(worker: tuple[Running, Behaviour]) -> None:
    busy = Behaviour(status=503)
    with serve(vllm_app(SERVED, busy)) as overloaded:
        table = RouteTable(model=PRIMARY, pools=[pool("batch", [overloaded.url, worker[0].url])])
        fe = Frontend(table)
        try:
            for _ in range(4):
                assert fe.post({"model": PRIMARY}).status_code == 200
            assert busy.seen  # it was tried
        finally:
            fe.running.stop()


def test_least_in_flight_balances_concurrent_requests() -> None:
    import concurrent.futures

    slow_b, fast_b = Behaviour(delay=0.6), Behaviour(delay=0.05)
    with serve(vllm_app(SERVED, slow_b)) as slow, serve(vllm_app(SERVED, fast_b)) as fast:
        fe = Frontend(RouteTable(model=PRIMARY, pools=[pool("batch", [slow.url, fast.url])]))
        try:
            with concurrent.futures.ThreadPoolExecutor(4) as ex:
                results = list(ex.map(lambda _: fe.post({"model": PRIMARY}).status_code, range(12)))
            assert results == [200] * 12
            # The fast worker frees up sooner, so it takes most of the requests.
            assert len(fast_b.seen) > len(slow_b.seen)
        finally:
            fe.running.stop()


def test_client_disconnect_cancels_the_worker_request(worker: tuple[Running, Behaviour]) -> None:
    worker[1].hold = True
    table = RouteTable(model=PRIMARY, pools=[pool("batch", [worker[0].url])])
    fe = Frontend(table)
    try:
        fe.hang_up({"model": PRIMARY}, reached=lambda: worker[1].in_flight == 1)
        deadline = time.monotonic() + 3
        while worker[1].cancelled == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert worker[1].cancelled == 1
        assert fe.router.in_flight(worker[0].url) == 0
    finally:
        fe.running.stop()


def test_wrong_method_on_an_audio_endpoint(frontend: Frontend) -> None:
    r = httpx.get(f"{frontend.url}/v1/audio/transcriptions")
    assert r.status_code == 405
    assert "use POST" in error(r)["message"]
    r = httpx.get(f"{frontend.url}/v1/nothing-here")
    assert r.status_code == 404 and error(r)["type"] == "not_found_error"
    assert_still_serving(frontend)


# --------------------------------------------------------------------------- recorded shapes


def test_vllms_recorded_verbose_json_goes_through_as_recorded(frontend: Frontend) -> None:
    """The verbatim recording (the real engine's, tiny.en through the English-only copy:
    a segment with its tokens, null fields), not the stand-in's invented segments."""
    recorded = json.loads(recording(VLLM, "verbose_json")[2])
    r = frontend.post({"model": "whisper-1", "response_format": "verbose_json"})
    assert r.status_code == 200, r.text
    got = r.json()
    assert recorded["text"].strip() and recorded["segments"][0]["tokens"]
    assert (got["text"], got["duration"], got["language"]) == (
        recorded["text"], recorded["duration"], "en")  # fmt: skip
    # null fields are left out, as OpenAI leaves them out; every other one is as recorded.
    want = [{k: v for k, v in s.items() if v is not None} for s in recorded["segments"]]
    assert [{k: v for k, v in s.items() if k in want[0]} for s in got["segments"]] == want
    srt = frontend.post({"model": "whisper-1", "response_format": "srt"})
    assert (
        srt.text
        == "1\n00:00:00,000 --> 00:00:03,660\nspeech recognition turns spoken words into written text.\n"
    )


def test_the_stand_ins_invented_segments_have_vllms_recorded_shape() -> None:
    """Segments are invented for multilingual models; they must not drift from vLLM's
    recorded segment (same fields, same JSON types where the recording has a value)."""
    from testkit.standins import _segments_body

    recorded = json.loads(recording(VLLM, "verbose_json")[2])
    invented = json.loads(_segments_body(recording(VLLM, "verbose_json")[2]))
    assert set(invented) == set(recorded)
    shape = recorded["segments"][0]
    for seg in invented["segments"]:
        assert set(seg) == set(shape)
        for k, v in shape.items():
            if v is not None:
                assert type(seg[k]) is type(v) or {type(seg[k]), type(v)} <= {int, float}, k


@pytest.fixture
def transformers_frontend(transformers_worker: tuple[Running, Behaviour]) -> Iterator[Frontend]:
    seq = pool(
        "seq", [transformers_worker[0].url], engine=Engine.TRANSFORMERS, mode=Mode.SEQUENTIAL
    )
    table = RouteTable(model=PRIMARY, aliases=["whisper-1"], pools=[
        seq.model_copy(update={"worker_model": TRANSFORMERS_MODEL})])  # fmt: skip
    fe = Frontend(table)
    yield fe
    fe.running.stop()


TRANSFORMERS_TEXT = json.loads(recording(TRANSFORMERS, "json")[2])["text"]
TRANSFORMERS_MODEL = "/models/whisper-tiny.en"  # the stand-in's (transformers_app's default)


def test_transformers_json_and_text_from_its_bare_text_answer(
    transformers_frontend: Frontend, transformers_worker: tuple[Running, Behaviour]
) -> None:
    fe = transformers_frontend
    r = fe.client.audio.transcriptions.create(model="whisper-1", file=("a.wav", WAV))
    assert r.text == TRANSFORMERS_TEXT
    # Not the client's name, nor the primary: the name the worker loaded (it has no aliases).
    assert dict(transformers_worker[1].seen[-1].fields)["model"] == TRANSFORMERS_MODEL
    text = fe.post({"model": "whisper-1", "response_format": "text"})
    assert text.headers["content-type"] == "text/plain; charset=utf-8"
    assert text.text == TRANSFORMERS_TEXT.strip() + "\n"
    # It renders json only: it is asked for json, whatever the client asked.
    assert dict(transformers_worker[1].seen[-1].fields)["response_format"] == "json"


def test_transformers_raw_text_stream_becomes_openai_events(
    transformers_frontend: Frontend,
) -> None:
    events = list(transformers_frontend.client.audio.transcriptions.create(
        model="whisper-1", file=("a.wav", WAV), stream=True))  # fmt: skip
    assert events[-1].type == "transcript.text.done"
    deltas = [e.delta for e in events if e.type == "transcript.text.delta"]
    assert len(deltas) == 19 and "".join(deltas) == events[-1].text == TRANSFORMERS_TEXT


def test_transformers_without_segments_is_refused_with_the_capability(
    transformers_frontend: Frontend, transformers_worker: tuple[Running, Behaviour]
) -> None:
    for fmt in ("srt", "vtt", "verbose_json"):
        r = transformers_frontend.post({"model": "whisper-1", "response_format": fmt})
        assert r.status_code == 400
        assert error(r)["message"].endswith("missing capability segment_timestamps")
    r = transformers_frontend.post({"model": "whisper-1"}, endpoint="translations")
    assert r.status_code == 400 and error(r)["message"].endswith("missing capability translations")
    assert transformers_worker[1].seen == []


def test_transformers_bare_500_becomes_an_error_naming_pool_and_engine(
    transformers_frontend: Frontend,
) -> None:
    # An mp3 frame header passes the gateway's sniffing; the engine cannot decode the rest
    # and answers its bare `500 Internal Server Error` (recorded).
    r = transformers_frontend.post({"model": "whisper-1"}, file=b"\xff\xfb\x90" + b"\x00" * 64)
    assert r.status_code == 502, r.text
    e = error(r)
    assert (e["type"], e["code"]) == ("server_error", "worker_error")
    assert e["message"].startswith(
        "the transformers worker of pool seq failed to process the request (500: Internal Server Error)"
    )
    assert_still_serving_on(transformers_frontend, TRANSFORMERS_TEXT)


def assert_still_serving_on(fe: Frontend, text: str) -> None:
    assert (
        fe.client.audio.transcriptions.create(model="whisper-1", file=("a.wav", WAV)).text == text
    )

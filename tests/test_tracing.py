"""Tracing through the gateway, over real HTTP: the frontend exports its spans over OTLP/HTTP
to a collector in this process (testkit/otlp.py), the vLLM stand-in behind it records the
`traceparent` each request brought. Off by default: no exporter, no header."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import websockets
from pydantic import ValidationError

from testkit.frontend import FIXTURE_TEXT, PRIMARY, Frontend, error, pool, wait_until
from testkit.host import free_port
from testkit.longaudio import bursts
from testkit.otlp import Collector, Span, collector, tree
from testkit.realtime import server_event, silence
from testkit.resources import make_td
from testkit.standins import Behaviour, Running, serve, vllm_app
from transcription_api import crd
from transcription_api.capabilities import Engine, Mode
from transcription_api.routes import RouteTable
from transcription_api.v1alpha1 import (
    OTLP_ENDPOINT,
    OTLP_ENDPOINT_MESSAGE,
    TranscriptionDeploymentSpec,
)
from transcription_api.worker import WorkerSettings
from transcription_frontend.tracing import OtelTracer, Tracer, TracingSettings, setup
from transcription_operator.children import build
from transcription_operator.config import OperatorConfig
from transcription_worker.launchers.vllm import vllm_args

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"
ROOT = "POST /v1/audio/transcriptions"


@pytest.fixture
def otlp() -> Iterator[Collector]:
    with collector() as c:
        yield c


def traced(table: RouteTable, otlp: Collector, **gateway: object) -> tuple[Frontend, OtelTracer]:
    tracer = OtelTracer(TracingSettings(endpoint=otlp.traces_url, service_name="fe-test"))
    return Frontend(table, tracer=tracer, **gateway), tracer


def spans_until(otlp: Collector, tracer: OtelTracer, ready: Callable[[], list[Span]]
                ) -> list[Span]:  # fmt: skip
    """The spans `ready` picks, once it picks some: a request's span ends just after its
    answer has been sent, so the test may ask before it has."""
    deadline = time.monotonic() + 10
    while True:
        tracer.provider.force_flush()
        found = ready()
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def one(spans: list[Span], name: str) -> Span:
    named = [s for s in spans if s.name == name]
    assert len(named) == 1, (name, [s.name for s in spans])
    return named[0]


def traceparent(worker: Behaviour, i: int = -1) -> tuple[str, str, str, str] | None:
    header = worker.seen[i].headers.get("traceparent")
    if header is None:
        return None
    version, trace_id, span_id, flags = header.split("-")
    return version, trace_id, span_id, flags


def roots(otlp: Collector) -> list[Span]:
    return [s for s in otlp.named(ROOT) if s.attributes.get("http.response.status_code")]


# --------------------------------------------------------------------------- one request


def test_a_request_is_a_span_per_step_under_the_clients_trace_and_the_worker_continues_it(
    worker: tuple[Running, Behaviour], otlp: Collector,
) -> None:  # fmt: skip
    table = RouteTable(model=PRIMARY, aliases=["whisper-1"], pools=[pool("batch", [worker[0].url])])
    fe, tracer = traced(table, otlp)
    try:
        r = fe.post({"model": "whisper-1"}, headers={"traceparent": TRACEPARENT})
        assert r.status_code == 200 and r.json()["text"] == FIXTURE_TEXT
        spans = spans_until(otlp, tracer, lambda: roots(otlp) and otlp.trace(CLIENT_TRACE))
    finally:
        fe.running.stop()
    print(f"\ntrace {CLIENT_TRACE} (the client's span: {CLIENT_SPAN}):\n{tree(spans)}")
    assert {s.service for s in spans} == {"fe-test"}
    root = one(spans, ROOT)
    assert (root.kind, root.parent_id) == ("server", CLIENT_SPAN)  # the client's trace goes on
    assert root.attributes["http.response.status_code"] == 200
    assert root.attributes["transcription.model"] == PRIMARY
    assert root.attributes["transcription.pool"] == "batch"
    assert root.attributes["transcription.request_id"]
    steps = [s for s in spans if s.parent_id == root.span_id]
    assert [s.name for s in sorted(steps, key=lambda s: s.start)] == [
        "receive", "parse", "route", "forward",
    ]  # fmt: skip
    assert one(spans, "receive").attributes["transcription.upload.bytes"] > 0
    assert one(spans, "parse").attributes["transcription.audio.container"] == "wav"
    route = one(spans, "route")
    assert route.attributes["transcription.pools"] == ["batch"]
    assert route.attributes["transcription.needs"] == ["transcriptions"]
    forward = one(spans, "forward")
    assert forward.attributes["transcription.pool"] == "batch"
    assert forward.attributes["transcription.worker"] == worker[0].url
    assert forward.attributes["transcription.engine"] == "vllm"
    call = one(spans, "worker")
    assert (call.kind, call.parent_id) == ("client", forward.span_id)
    assert call.attributes["transcription.pool"] == "batch"
    assert call.attributes["transcription.worker"] == worker[0].url
    assert call.attributes["url.full"] == worker[0].url + "/v1/audio/transcriptions"
    assert call.attributes["http.response.status_code"] == 200
    # The worker got the trace, with the `worker` span as its parent, sampled as the client's.
    assert traceparent(worker[1]) == ("00", CLIENT_TRACE, call.span_id, "01")
    # Each step within its parent's time, and nothing marked an error.
    for s in spans:
        parent = next((p for p in spans if p.span_id == s.parent_id), None)
        assert parent is None or parent.start <= s.start <= s.end <= parent.end, s.name
        assert s.status != 2, s.name


def test_without_a_traceparent_a_request_starts_a_trace_and_passes_it_on(
    worker: tuple[Running, Behaviour], otlp: Collector,
) -> None:  # fmt: skip
    table = RouteTable(model=PRIMARY, aliases=["whisper-1"], pools=[pool("batch", [worker[0].url])])
    fe, tracer = traced(table, otlp)
    try:
        assert fe.post({"model": "whisper-1"}).status_code == 200
        (root,) = spans_until(otlp, tracer, lambda: roots(otlp))
    finally:
        fe.running.stop()
    assert root.parent_id == "" and root.kind == "server"
    call = one(otlp.trace(root.trace_id), "worker")
    got = traceparent(worker[1])
    assert got is not None and got[:3] == ("00", root.trace_id, call.span_id)
    assert int(got[3], 16) & 1  # sampled (the SDK also sets W3C's "random trace id" flag)


MALFORMED = [
    "garbage",
    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",  # no flags
    "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # an all-zero trace id
    "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  # an all-zero span id
    "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # version ff: invalid
    "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",  # upper case
    "00-4bf92f3577b34da6a3ce929d0e0e47-00f067aa0ba902b7-01",  # short trace id
    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",  # version 00 with more
    "\u00e9\u00e9-" + "a" * 60,  # not ASCII (sent as latin-1)
]


def test_a_malformed_traceparent_is_ignored_the_request_starts_its_own_trace(
    worker: tuple[Running, Behaviour], otlp: Collector,
) -> None:  # fmt: skip
    table = RouteTable(model=PRIMARY, aliases=["whisper-1"], pools=[pool("batch", [worker[0].url])])
    fe, tracer = traced(table, otlp)
    try:
        for i, bad in enumerate(MALFORMED):
            headers = {"traceparent": bad.encode("latin-1"), "tracestate": "a=b"}
            r = fe.post({"model": "whisper-1"}, headers=headers)
            assert r.status_code == 200, (bad, r.text)
            got = traceparent(worker[1])
            assert got is not None and got[1] != CLIENT_TRACE.upper(), bad
            assert got[1] not in bad and got[2] not in bad, bad
            assert "tracestate" not in worker[1].seen[-1].headers, bad  # none: it was ignored
            assert len(worker[1].seen) == i + 1
        found = spans_until(otlp, tracer, lambda: [s for s in roots(otlp)
                                                   if len(roots(otlp)) == len(MALFORMED)])  # fmt: skip
    finally:
        fe.running.stop()
    assert len(found) == len(MALFORMED)
    assert all(s.parent_id == "" for s in found)
    assert len({s.trace_id for s in found}) == len(MALFORMED)


def test_a_valid_tracestate_and_unsampled_flag_are_followed(
    worker: tuple[Running, Behaviour], otlp: Collector,
) -> None:  # fmt: skip
    """A client's trace it did not sample: no span is exported, the worker is told the same."""
    table = RouteTable(model=PRIMARY, aliases=["whisper-1"], pools=[pool("batch", [worker[0].url])])
    fe, tracer = traced(table, otlp)
    try:
        unsampled = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-00"
        r = fe.post({"model": "whisper-1"}, headers={"traceparent": unsampled, "tracestate": "k=v"})
        assert r.status_code == 200
        tracer.provider.force_flush()
    finally:
        fe.running.stop()
    got = traceparent(worker[1])
    assert got is not None and got[1] == CLIENT_TRACE and got[3] == "00"
    assert worker[1].seen[-1].headers.get("tracestate") == "k=v"
    assert otlp.trace(CLIENT_TRACE) == []


# --------------------------------------------------------------------------- retries, holds


def test_a_retry_is_a_second_worker_span_and_a_hold_is_a_span(
    worker: tuple[Running, Behaviour], otlp: Collector,
) -> None:  # fmt: skip
    dead = f"http://127.0.0.1:{free_port()}"
    table = RouteTable(model=PRIMARY, aliases=["whisper-1"], pools=[pool("batch", [dead])])
    fe, tracer = traced(table, otlp)
    try:
        # The dead endpoint refuses; none is left, so the request is held, and tries it
        # again after each backoff (0.1 s, doubling), until discovery brings the live one:
        # once the request is held (a fixed delay could pass before it even arrived).
        with ThreadPoolExecutor(1) as ex:
            answer = ex.submit(
                fe.post, {"model": "whisper-1"}, headers={"traceparent": TRACEPARENT}
            )
            wait_until(lambda: fe.gateway.holds.held("batch") == 1, timeout=30, what="the hold")
            fe.endpoints("batch", [worker[0].url])
            r = answer.result(timeout=30)
        assert r.status_code == 200, r.text
        spans = spans_until(otlp, tracer, lambda: roots(otlp) and otlp.trace(CLIENT_TRACE))
    finally:
        fe.running.stop()
    print(f"\n{tree(spans)}")
    forward = one(spans, "forward")
    calls = sorted((s for s in spans if s.name == "worker"), key=lambda s: s.start)
    *refused, served = calls
    assert refused and {c.attributes["transcription.worker"] for c in refused} == {dead}
    assert served.attributes["transcription.worker"] == worker[0].url
    assert [c.attributes["transcription.attempt"] for c in calls] == list(range(1, len(calls) + 1))
    assert all(c.parent_id == forward.span_id for c in calls)
    for c in refused:  # could not connect
        assert c.status == 2 and "exception" in c.events
        assert c.attributes["error.type"].endswith("Error")
    holds = sorted((s for s in spans if s.name == "hold"), key=lambda s: s.start)
    assert len(holds) == len(refused)  # one after each refusal
    for before, hold, after in zip(refused, holds, calls[1:], strict=True):
        assert hold.parent_id == forward.span_id
        assert hold.attributes["transcription.pool"] == "batch"
        assert before.end <= hold.start <= hold.end <= after.start
    assert traceparent(worker[1]) == ("00", CLIENT_TRACE, served.span_id, "01")
    assert forward.attributes["transcription.worker"] == worker[0].url


def test_a_refused_request_is_traced_with_its_status_not_as_a_server_error(
    worker: tuple[Running, Behaviour], otlp: Collector,
) -> None:  # fmt: skip
    table = RouteTable(model=PRIMARY, aliases=["whisper-1"], pools=[pool("batch", [worker[0].url])])
    fe, tracer = traced(table, otlp)
    try:
        r = fe.post({"model": "nope"}, headers={"traceparent": TRACEPARENT})
        assert r.status_code == 404 and "nope" in error(r)["message"]
        spans = spans_until(otlp, tracer, lambda: roots(otlp) and otlp.trace(CLIENT_TRACE))
    finally:
        fe.running.stop()
    root = one(spans, ROOT)
    assert root.attributes["http.response.status_code"] == 404
    assert root.attributes["transcription.error.code"] == "model_not_found"
    assert root.status != 2  # a client's mistake is not the server's error
    # Refused at the form's `model` field, while the body is received (before its file).
    receive = one(spans, "receive")
    assert receive.attributes["error.type"] == "404" and receive.status != 2
    assert not worker[1].seen


# --------------------------------------------------------------------------- long audio


def test_long_audio_is_a_fanout_span_with_a_child_per_chunk_each_forwarded(
    worker: tuple[Running, Behaviour], otlp: Collector,
) -> None:  # fmt: skip
    table = RouteTable(model=PRIMARY, aliases=["whisper-1"], pools=[pool("batch", [worker[0].url])])
    fe, tracer = traced(table, otlp)
    try:
        r = fe.post({"model": "whisper-1", "chunking_strategy": "auto"}, bursts(70),
                    headers={"traceparent": TRACEPARENT}, timeout=120)  # fmt: skip
        assert r.status_code == 200, r.text
        spans = spans_until(otlp, tracer, lambda: [s for s in otlp.trace(CLIENT_TRACE)
                                                   if s.parent_id == CLIENT_SPAN])  # fmt: skip
        spans = otlp.trace(CLIENT_TRACE)
    finally:
        fe.running.stop()
    print(f"\n{tree(spans)}")
    (root,) = [s for s in spans if s.parent_id == CLIENT_SPAN]
    assert root.name == ROOT and root.attributes["transcription.pool"] == "chunked"
    cut = one(spans, "longaudio.cut")
    fanout = one(spans, "longaudio.fanout")
    assert cut.parent_id == root.span_id == fanout.parent_id
    chunks = sorted((s for s in spans if s.name == "longaudio.chunk"),
                    key=lambda s: s.attributes["transcription.chunk.index"])  # fmt: skip
    assert len(chunks) == cut.attributes["transcription.chunks"] >= 3
    assert fanout.attributes["transcription.chunks"] == len(chunks)
    assert [c.attributes["transcription.chunk.index"] for c in chunks] == list(range(len(chunks)))
    assert all(c.parent_id == fanout.span_id for c in chunks)
    # Each chunk is a request through the pipeline (internal, not a server span), forwarded.
    calls = [s for s in spans if s.name == "worker"]
    assert len(calls) == len(chunks) == len(worker[1].seen)
    for chunk in chunks:
        (sub,) = [s for s in spans if s.parent_id == chunk.span_id]
        assert (sub.name, sub.kind) == (ROOT, "internal")
        forward = next(s for s in spans if s.name == "forward" and s.parent_id == sub.span_id)
        (call,) = [s for s in calls if s.parent_id == forward.span_id]
        assert call.attributes["transcription.pool"] == "batch"
    sent = {traceparent(worker[1], i) for i in range(len(worker[1].seen))}
    assert sent == {("00", CLIENT_TRACE, c.span_id, "01") for c in calls}


# --------------------------------------------------------------------------- realtime


def test_each_realtime_turn_is_a_span_under_the_upgrades_trace(otlp: Collector) -> None:
    b = Behaviour()
    with serve(vllm_app([PRIMARY, "whisper-1"], b)) as worker:
        table = RouteTable(
            model=PRIMARY, aliases=["whisper-1"], pools=[pool("batch", [worker.url])]
        )
        fe, tracer = traced(table, otlp)
        try:

            async def scenario() -> None:
                url = fe.url.replace("http://", "ws://") + "/v1/realtime?intent=transcription"
                async with websockets.connect(
                    url, additional_headers={"traceparent": TRACEPARENT}
                ) as ws:
                    manual = {"type": "transcription", "audio": {"input": {"turn_detection": None}}}
                    await ws.send(json.dumps({"type": "session.update", "session": manual}))
                    for _ in range(2):
                        audio = base64.b64encode(silence(0.5)).decode()
                        await ws.send(json.dumps({"type": "input_audio_buffer.append",
                                                  "audio": audio}))  # fmt: skip
                        await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
                        async with asyncio.timeout(30):
                            while True:
                                event = server_event(await ws.recv())
                                assert event.type != "error", event
                                if event.type.endswith("input_audio_transcription.completed"):
                                    break

            asyncio.run(scenario())
            spans = spans_until(otlp, tracer, lambda: [s for s in otlp.named("worker")
                                                       if len(otlp.named("worker")) == 2])  # fmt: skip
            spans = otlp.trace(CLIENT_TRACE)
        finally:
            fe.running.stop()
    print(f"\n{tree(spans)}")
    turns = [s for s in spans if s.name == "realtime.turn"]
    assert len(turns) == 2 and all(t.parent_id == CLIENT_SPAN for t in turns)
    assert all(t.attributes["transcription.audio.seconds"] == 0.5 for t in turns)
    for turn in turns:
        (sub,) = [s for s in spans if s.parent_id == turn.span_id]
        assert (sub.name, sub.kind) == (ROOT, "internal")
    calls = [s for s in spans if s.name == "worker"]
    sent = {b.seen[i].headers.get("traceparent") for i in range(len(b.seen))}
    assert sent == {f"00-{CLIENT_TRACE}-{c.span_id}-01" for c in calls}


# --------------------------------------------------------------------------- off


def test_off_by_default_no_span_no_header_no_sdk(worker: tuple[Running, Behaviour]) -> None:
    table = RouteTable(model=PRIMARY, aliases=["whisper-1"], pools=[pool("batch", [worker[0].url])])
    fe = Frontend(table)
    try:
        assert type(fe.gateway.tracer) is Tracer and not fe.gateway.tracer.enabled
        assert fe.post({"model": "whisper-1"}).status_code == 200
        assert "traceparent" not in worker[1].seen[-1].headers  # none invented
        # Off, the gateway takes no part in traces: a client's header is not passed on.
        r = fe.post({"model": "whisper-1"}, headers={"traceparent": TRACEPARENT})
        assert r.status_code == 200
        assert "traceparent" not in worker[1].seen[-1].headers
    finally:
        fe.running.stop()
    # A gateway started without OTLP settings never loads the SDK or an exporter (FastAPI
    # itself loads OpenTelemetry's API).
    code = (
        "import os, sys; from transcription_frontend import main, tracing; "
        "t = tracing.setup(tracing.TracingSettings.from_env(os.environ)); "
        "assert type(t) is tracing.Tracer, t; "
        "print(sorted(m for m in sys.modules if m.startswith(('opentelemetry.sdk', "
        "'opentelemetry.exporter', 'opentelemetry.proto'))))"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True, timeout=60)  # fmt: skip
    assert out.stdout.strip() == "[]", out.stdout


def test_settings_from_opentelemetrys_variables() -> None:
    assert TracingSettings.from_env({}) == TracingSettings()
    assert setup(TracingSettings.from_env({})).enabled is False
    base = TracingSettings.from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel:4318/"})
    assert base.endpoint == "http://otel:4318/v1/traces"
    full = TracingSettings.from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel:4318",
                                     "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t:4318/x"})  # fmt: skip
    assert full.endpoint == "http://t:4318/x"
    s = TracingSettings.from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel:4318",
                                  "OTEL_SERVICE_NAME": "whisper-frontend",
                                  "OTEL_TRACES_SAMPLER_ARG": "0.25"})  # fmt: skip
    assert (s.service_name, s.sampling_ratio) == ("whisper-frontend", 0.25)
    for off in ({"OTEL_SDK_DISABLED": "true"}, {"OTEL_TRACES_EXPORTER": "none"}):
        assert TracingSettings.from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://o:4318", **off}
                                        ).endpoint is None  # fmt: skip
    bad = TracingSettings.from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://o:4318",
                                    "OTEL_TRACES_SAMPLER_ARG": "lots"})  # fmt: skip
    assert bad.sampling_ratio == 1.0


def test_sampling_ratio_zero_exports_no_new_trace_but_still_propagates(
    worker: tuple[Running, Behaviour], otlp: Collector,
) -> None:  # fmt: skip
    table = RouteTable(model=PRIMARY, aliases=["whisper-1"], pools=[pool("batch", [worker[0].url])])
    tracer = OtelTracer(TracingSettings(endpoint=otlp.traces_url, sampling_ratio=0.0))
    fe = Frontend(table, tracer=tracer)
    try:
        assert fe.post({"model": "whisper-1"}).status_code == 200
        assert (
            fe.post({"model": "whisper-1"}, headers={"traceparent": TRACEPARENT}).status_code == 200
        )
        tracer.provider.force_flush()
    finally:
        fe.running.stop()
    first, second = traceparent(worker[1], 0), traceparent(worker[1], 1)
    assert first is not None and not int(first[3], 16) & 1  # a new trace, not sampled: said so
    assert second is not None and second[1] == CLIENT_TRACE and second[3] == "01"  # the client's
    assert all(s.trace_id == CLIENT_TRACE for s in otlp.spans) and otlp.spans


# --------------------------------------------------------------------------- the resource

SPEC = {
    "model": {"name": PRIMARY, "aliases": ["whisper-1"]},
    "engine": "vllm",
    "pools": [
        {"name": "batch", "resources": {"gpus": 1}},
        {"name": "fw", "engine": "faster-whisper", "mode": "sequential"},
    ],
}
COLLECTOR = "http://otel-collector.monitoring:4318"


def children(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The containers of the resource's Deployments, by Deployment name."""
    out = {}
    for m in build(make_td(spec), OperatorConfig()):
        if m["kind"] == "Deployment":
            (container,) = m["spec"]["template"]["spec"]["containers"]
            out[m["metadata"]["name"]] = container
    return out


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container["env"]}


def test_off_by_default_the_pods_get_no_opentelemetry_variable_or_flag() -> None:
    for container in children(SPEC).values():
        assert not [n for n in env_of(container) if n.startswith("OTEL_")]
        settings = env_of(container).get("TRANSCRIPTION_WORKER_SETTINGS")
        assert settings is None or "otlp" not in settings


def test_the_endpoint_reaches_the_frontend_and_vllm_as_opentelemetrys_variables() -> None:
    spec = {**SPEC, "tracing": {"endpoint": COLLECTOR + "/", "samplingRatio": 0.25}}
    pods = children(spec)
    frontend = env_of(pods["whisper-frontend"])
    assert frontend["OTEL_EXPORTER_OTLP_ENDPOINT"] == COLLECTOR
    assert frontend["OTEL_SERVICE_NAME"] == "whisper-frontend"
    assert frontend["OTEL_TRACES_SAMPLER"] == "parentbased_traceidratio"
    assert "k8s.pod.name=$(POD_NAME)" in frontend["OTEL_RESOURCE_ATTRIBUTES"]
    names = [e["name"] for e in pods["whisper-frontend"]["env"]]
    assert names.index("POD_NAME") < names.index("OTEL_RESOURCE_ATTRIBUTES")  # $(POD_NAME)
    # What the frontend makes of its variables: one source, read back.
    s = TracingSettings.from_env(frontend)
    assert s == TracingSettings(COLLECTOR + "/v1/traces", "whisper-frontend", 0.25)
    # vLLM: its flag, its exporter over HTTP (its default is gRPC), the same sampling.
    vllm = env_of(pods["whisper-batch"])
    settings = WorkerSettings.model_validate_json(vllm["TRANSCRIPTION_WORKER_SETTINGS"])
    assert settings.otlp_traces_endpoint == COLLECTOR + "/v1/traces"
    args = vllm_args(settings)
    assert args[args.index("--otlp-traces-endpoint") + 1] == COLLECTOR + "/v1/traces"
    assert vllm["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] == "http/protobuf"
    assert vllm["OTEL_SERVICE_NAME"] == "whisper-batch"
    assert vllm["OTEL_TRACES_SAMPLER_ARG"] == "0.25"
    assert "transcription.pool=batch" in vllm["OTEL_RESOURCE_ATTRIBUTES"]
    # faster-whisper has no tracing of its own (it logs the traceparent it gets).
    fw = env_of(pods["whisper-fw"])
    assert not [n for n in fw if n.startswith("OTEL_")]
    assert "otlp" not in fw["TRANSCRIPTION_WORKER_SETTINGS"]


def test_a_pools_own_opentelemetry_variable_wins() -> None:
    pools = [{"name": "batch", "resources": {"gpus": 1},
              "env": [{"name": "OTEL_SERVICE_NAME", "value": "mine"}]}]  # fmt: skip
    pods = children({**SPEC, "pools": pools, "tracing": {"endpoint": COLLECTOR}})
    names = [e["name"] for e in pods["whisper-batch"]["env"]]
    assert (
        names.count("OTEL_SERVICE_NAME") == 1
        and env_of(pods["whisper-batch"])["OTEL_SERVICE_NAME"] == "mine"
    )


@pytest.mark.parametrize(
    "endpoint",
    ["otel-collector:4318", "ftp://otel:4318", "http://user:secret@otel:4318",
     "http://otel:4318/v1/traces?x=1", "http://", "http://otel collector:4318", ""],
)  # fmt: skip
def test_an_endpoint_that_is_no_collector_url_is_refused_by_name(endpoint: str) -> None:
    with pytest.raises(ValidationError) as e:
        TranscriptionDeploymentSpec.model_validate({**SPEC, "tracing": {"endpoint": endpoint}})
    assert OTLP_ENDPOINT_MESSAGE in str(e.value) and repr(endpoint) in str(e.value)
    # The API server refuses it alike: the CRD's CEL rule uses the same pattern and message.
    rule = crd.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"][
        "properties"
    ]["tracing"]["x-kubernetes-validations"][0]
    assert rule["message"] == OTLP_ENDPOINT_MESSAGE and OTLP_ENDPOINT in rule["rule"]


def test_a_sampling_ratio_out_of_range_is_refused() -> None:
    for ratio in (-0.1, 1.5):
        with pytest.raises(ValidationError, match=r"tracing\.samplingRatio"):
            TranscriptionDeploymentSpec.model_validate(
                {**SPEC, "tracing": {"endpoint": COLLECTOR, "samplingRatio": ratio}}
            )


def test_vllms_tracing_flag_is_the_operators_not_an_engine_arg() -> None:
    pools = [{"name": "batch", "engineArgs": ["--otlp-traces-endpoint=http://x:4318"]}]
    with pytest.raises(ValidationError, match=r"it is derived from spec\.tracing\.endpoint"):
        TranscriptionDeploymentSpec.model_validate({**SPEC, "pools": pools})


# --------------------------------------------------------------------------- faster-whisper


def test_the_cpu_worker_logs_the_traceparent_it_got(
    cpu_worker: Running, otlp: Collector, caplog: pytest.LogCaptureFixture
) -> None:
    fw = pool("fw", [cpu_worker.url], engine=Engine.FASTER_WHISPER, mode=Mode.SEQUENTIAL)
    fe, tracer = traced(RouteTable(model="whisper-tiny.en", pools=[fw]), otlp)
    try:
        with caplog.at_level(logging.INFO, logger="transcription_worker"):
            r = fe.post({"model": "whisper-tiny.en"}, headers={"traceparent": TRACEPARENT})
        assert r.status_code == 200, r.text
        spans = spans_until(otlp, tracer, lambda: roots(otlp) and otlp.trace(CLIENT_TRACE))
    finally:
        fe.running.stop()
    call = one(spans, "worker")
    assert call.attributes["transcription.engine"] == "faster-whisper"
    logged = [r.getMessage() for r in caplog.records if r.name == "transcription_worker"]
    assert any(f"traceparent=00-{CLIENT_TRACE}-{call.span_id}-01" in m for m in logged), logged
